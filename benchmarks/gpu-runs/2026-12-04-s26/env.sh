# sourced by the session's device-call scripts: wheels into a private site, results dir $R
set -u
export NUMBA_ENABLE_CUDASIM=0 PYTHONUNBUFFERED=1
site=/tmp/hexcore-site
mkdir -p $site
if [ ! -f $site/.ok ]; then python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target $site .whl/*.whl && touch $site/.ok; fi
export PYTHONPATH=$site:$PWD
R=/tmp/r; mkdir -p $R
git log --oneline -1 > $R/head.txt 2>/dev/null; git status --short >> $R/head.txt 2>/dev/null
