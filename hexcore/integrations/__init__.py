"""hexcore inside other libraries' inference loops.

- ``hexcore.integrations.transformers``: :class:`HexcoreCache`, a Hugging Face
  transformers ``Cache`` over an :class:`hexcore.Engine`, and the ``"hexcore"`` attention
  implementation (``pip install hexcore-llm[hf]``; docs/transformers.md).

Nothing here is imported by the rest of hexcore: each integration imports its library
(torch, transformers) only when it is imported itself.
"""
