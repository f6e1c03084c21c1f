"""The columns to read of an ncu ``--csv --page raw`` file, one line per profiled kernel:

    python3 benchmarks/experiments/ncu_rows.py FILE.csv

Kernel name, time, SM cycles active (average and busiest SM), warp instructions, DRAM bytes
read, registers, grid size, achieved warp occupancy and the no-instruction, long-scoreboard,
immediate-constant-miss and branch-resolving stalls per issue (where collected), each cut to 40 characters; a file
with no rows says so. Used by the experiments' GPU call scripts.
"""
import csv
import sys

WANT = ["Kernel Name", "gpu__time_duration.sum", "sm__cycles_active.avg", "sm__cycles_active.max",
        "smsp__inst_executed.sum", "dram__bytes_read.sum", "launch__registers_per_thread", "launch__grid_size",
        "sm__warps_active.avg.pct_of_peak_sustained_active",
        "smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_imc_miss_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio"]


def main(path: str) -> None:
    with open(path) as f:
        rows = [r for r in csv.reader(f) if len(r) > 5 and (r[0] == "ID" or r[0].isdigit() or r[0] == "")]
    if not rows:
        print("no rows")
        return
    idx = [rows[0].index(w) for w in WANT if w in rows[0]]
    for r in rows[2:]:  # (the second row holds the units)
        print(" | ".join(r[i][:40] for i in idx))


if __name__ == "__main__":
    main(sys.argv[1])
