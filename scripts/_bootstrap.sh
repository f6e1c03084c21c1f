# Sourced by scripts/test and scripts/demo: makes .venv and installs hexcore (editable)
# with the extras named in $HEXCORE_EXTRAS; does nothing when pyproject.toml is unchanged.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
stamp=".venv/.hexcore-$(sha1sum pyproject.toml | cut -c1-12)-${HEXCORE_EXTRAS:-none}"
if [ ! -f "$stamp" ]; then
    .venv/bin/python -m pip install -q --disable-pip-version-check -e ".${HEXCORE_EXTRAS:+[$HEXCORE_EXTRAS]}" 2>&1 \
        | grep -v '^WARNING: Location' || true
    .venv/bin/python -c "import hexcore" && touch "$stamp"
fi
