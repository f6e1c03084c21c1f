# Sourced by the A/B calls (this folder's and later sessions' calls.sh), after device-site.sh
# (site, R). ab_trees TREE...: in each tree in turn (this checkout is named main, a copy by its
# folder's name), ab_rows.py --rounds 2 in one process, into $R/ab-NAME.log and
# $R/decode_NAME.json; then ab_table.py prints every tree's rows side by side.
ab_trees() {
    local tree name
    for tree in "$@"; do
        name=$(basename "$tree")
        [ "$tree" = "$PWD" ] && name=main
        (cd "$tree" && OUT=$R PYTHONPATH="$site:$tree" timeout 170 python3 \
            benchmarks/experiments/2026-12-07-s62/ab_rows.py --rounds 2 --name "$name" > "$R/ab-$name.log" 2>&1)
        echo "== $name rc $?"
    done
    python3 benchmarks/experiments/2026-12-07-s62/ab_table.py "$R"
}
