#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Compares kernel templates side by side in one run: pooler-kernel-bench (--chain or --engine) once
per variant per round, the variants alternated (so that a drift of the machine hits them alike), each
variant's templates given by POOLER_TEMPLATE_DIR; then, per row (tp, b, and the trigger of x in the
engine), the median of each variant's rounds with their range, and its difference to the first.

  tools/compare_kernels.py [--rounds R] [--bench PATH] [--out DIR] [--metric KEY]
                           [--env NAME:VAR=VALUE ...] [--bench-of NAME:PATH ...]
                           NAME=FOLDER ... -- --chain|--engine [bench options]
  tools/compare_kernels.py --summarize DIR [--metric KEY]
  tools/compare_kernels.py --self-test

NAME=FOLDER: a folder of kernel templates (its subfolders included, as POOLER_TEMPLATE_DIR takes
them); the FOLDER `embedded` runs the templates built into the bench. The templates of an earlier
commit: `mkdir -p F && git archive COMMIT kernel_templates | tar -x -C F`, then F/kernel_templates. The
bench (the host code) is --bench unless --bench-of names another; a template folder must keep the
templates' kernel arguments and shared-memory sizes of its bench. --env
NAME:VAR=VALUE sets an environment variable for one variant's runs, e.g. a rule's override
(`--env split4:POOLER_CONSUMER_ROW_CTAS=4 rule=embedded split4=embedded`). --bench-of NAME:PATH runs
another build's bench for one variant, for a change of the host code (a rule, a shared-memory size):
build the earlier commit elsewhere and compare `--bench-of old:DIR/build/tools/pooler-kernel-bench
old=embedded now=embedded`. The
default metric: fused_us, in the engine too: a layer with the fused pooler. Its marginal latency
(marginal_fused_us) subtracts each run's NULL layer, the same code for every variant, whose noise
(up to 3 us at b <= 2) would enter the differences. Every run's JSON and log stay in --out.
After each round but the last the table so far is printed too, so that a run cut short keeps its
figures. Exits 1 when a run fails (its log's tail is printed) or a row's check is not "ok".
"""

import argparse
import dataclasses
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
from contextlib import redirect_stdout
from pathlib import Path


@dataclasses.dataclass
class Variant:
    name: str
    folder: str  # its templates, or "embedded"
    env: dict = dataclasses.field(default_factory=dict)  # --env settings
    bench: "str | None" = None  # --bench-of; None: --bench


def parse_variants(specs, envs=(), benches=()):
    variants = []
    for spec in specs:
        name, sep, folder = spec.partition("=")
        if not sep or not name or not folder or "_" in name:
            raise SystemExit(f"compare_kernels: variant {spec!r}: expected NAME=FOLDER, NAME without '_'")
        if folder != "embedded" and not Path(folder).is_dir():
            raise SystemExit(f"compare_kernels: variant {name}: {folder} is not a folder")
        if any(name == v.name for v in variants):
            raise SystemExit(f"compare_kernels: variant {name} given twice")
        variants.append(Variant(name, folder))
    if len(variants) < 2:
        raise SystemExit("compare_kernels: give at least two variants to compare")

    def per_variant(option, spec, expected):
        """NAME:REST of --option: the variant named NAME and REST (both checked)."""
        name, sep, rest = spec.partition(":")
        if not sep or not rest:
            raise SystemExit(f"compare_kernels: {option} {spec!r}: expected {expected}")
        variant = next((v for v in variants if v.name == name), None)
        if variant is None:
            raise SystemExit(f"compare_kernels: {option} {spec!r}: no variant named {name}")
        return variant, rest

    for spec in envs:
        variant, setting = per_variant("--env", spec, "NAME:VAR=VALUE")
        var, eq, value = setting.partition("=")
        if not eq or not var:
            raise SystemExit(f"compare_kernels: --env {spec!r}: expected NAME:VAR=VALUE")
        variant.env[var] = value
    for spec in benches:
        variant, path = per_variant("--bench-of", spec, "NAME:PATH")
        if not os.access(path, os.X_OK):
            raise SystemExit(f"compare_kernels: --bench-of {spec!r}: {path} is not an executable")
        variant.bench = path
    return variants


def run(args, bench_args):
    variants = parse_variants(args.variants, args.env, args.bench_of)
    mode = next((a for a in bench_args if a in ("--chain", "--engine")), None)
    if mode is None:
        raise SystemExit("compare_kernels: the bench options after -- must include --chain or --engine")
    out = Path(args.out or tempfile.mkdtemp(prefix="compare_kernels."))
    out.mkdir(parents=True, exist_ok=True)
    failed = False
    for r in range(1, args.rounds + 1):
        for variant in variants:
            name, folder = variant.name, variant.folder
            env = dict(os.environ, NCCL_NVLS_ENABLE="0")
            env.pop("POOLER_TEMPLATE_DIR", None)
            env.update(variant.env)
            if folder != "embedded":
                env["POOLER_TEMPLATE_DIR"] = str(Path(folder).resolve())
            stem = out / f"{mode[2:]}_{name}_r{r}"
            with open(f"{stem}.log", "w") as log:
                status = subprocess.call([variant.bench or args.bench, *bench_args, "--json", f"{stem}.json"], env=env,
                                         stdout=log, stderr=subprocess.STDOUT)
            print(f"compare_kernels: round {r}, {name}: rc {status}", flush=True)
            if status != 0:
                failed = True
                print("".join(open(f"{stem}.log").readlines()[-8:]), end="")
        if r < args.rounds:
            # The table so far: a run cut short (a device's time limit) still leaves its figures.
            print(f"compare_kernels: after round {r} of {args.rounds}:", flush=True)
            summarize(out, args.metric, [v.name for v in variants])
            sys.stdout.flush()
    print(f"compare_kernels: runs in {out}")
    return summarize(out, args.metric, [v.name for v in variants]) or failed


def summarize(folder, metric=None, order=None):
    """Prints the table; returns True when a row's check was not ok."""
    table, bad = {}, []
    for path in sorted(Path(folder).glob("*_r*.json")):
        mode, name = path.stem.split("_")[:2]
        key = metric or "fused_us"
        for row in json.load(open(path))["rows"]:
            if not row.get("rule", True):
                continue  # the chain's other weight paths
            if row.get("check", "ok") != "ok":
                bad.append(f"{path.name}: tp {row['tp']}, b {row['b']}: {row['check']}")
            value = row.get(key)
            if value is None:
                continue
            where = (row["tp"], row["b"], f"{mode} {row.get('trigger', '')}".strip())
            table.setdefault(where, {}).setdefault(name, []).append(value)
    names = order or sorted({n for cells in table.values() for n in cells})
    print(f"{'tp':>3} {'b':>3} {'run':<12}" + "".join(f" {n:>22}" for n in names))
    for (tp, b, run_of), cells in sorted(table.items(), key=lambda kv: (kv[0][2], -kv[0][0], kv[0][1])):
        line = f"{tp:>3} {b:>3} {run_of:<12}"
        first = None
        for n in names:
            values = cells.get(n)
            if not values:
                line += f" {'-':>22}"
                continue
            median = statistics.median(values)
            delta = "" if first is None else f" {median - first:+.2f}"
            first = median if first is None else first
            line += f" {f'{median:.2f} [{min(values):.2f}-{max(values):.2f}]{delta}':>22}"
        print(line)
    for line in bad:
        print(f"compare_kernels: check failed: {line}")
    return bool(bad)


def self_test():
    """The summary on made-up runs: medians, ranges, differences, failed checks."""
    with tempfile.TemporaryDirectory() as folder:
        def write(name, r, fused, check="ok"):
            rows = [{"tp": 8, "b": 1, "rule": True, "fused_us": fused, "check": check},
                    {"tp": 8, "b": 1, "rule": False, "fused_us": 99.0, "check": "ok"}]
            json.dump({"rows": rows}, open(Path(folder) / f"chain_{name}_r{r}.json", "w"))
        for r, (a, b) in enumerate([(5.0, 4.0), (5.2, 4.1), (5.1, 4.3)], 1):
            write("old", r, a)
            write("new", r, b)
        text = io.StringIO()
        with redirect_stdout(text):
            bad = summarize(folder, None, ["old", "new"])
        lines = text.getvalue().splitlines()
        assert not bad, text.getvalue()
        assert lines[1].split() == ["8", "1", "chain", "5.10", "[5.00-5.20]", "4.10", "[4.00-4.30]", "-1.00"], lines
        write("new", 4, 4.0, check="FAILED: mismatch")
        with redirect_stdout(io.StringIO()):
            assert summarize(folder, None, ["old", "new"])
    # A whole run with a made-up bench: the table after each round but the last, then the final one.
    with tempfile.TemporaryDirectory() as folder:
        bench = Path(folder) / "bench"
        bench.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                         "out = sys.argv[sys.argv.index('--json') + 1]\n"
                         "rows = [{'tp': 8, 'b': 1, 'trigger': 'early', 'check': 'ok',\n"
                         "         'fused_us': float(os.environ.get('FAKE_US', '3')), 'marginal_fused_us': 9.0}]\n"
                         "json.dump({'rows': rows}, open(out, 'w'))\n")
        bench.chmod(0o755)
        args = argparse.Namespace(variants=["a=embedded", "b=embedded"], env=["b:FAKE_US=4"], bench_of=[],
                                  out=str(Path(folder) / "runs"), rounds=2, bench=str(bench), metric=None)
        text = io.StringIO()
        with redirect_stdout(text):
            assert not run(args, ["--engine"])
        lines = text.getvalue().splitlines()
        after = lines.index("compare_kernels: after round 1 of 2:")
        assert lines[after + 2].split()[4:] == ["3.00", "[3.00-3.00]", "4.00", "[4.00-4.00]", "+1.00"], lines
        assert lines[-1].split()[4:] == ["3.00", "[3.00-3.00]", "4.00", "[4.00-4.00]", "+1.00"], lines
        assert sum(line.startswith("compare_kernels: after round") for line in lines) == 1, lines
    variants = parse_variants(["rule=embedded", "split4=embedded"], ["split4:POOLER_CONSUMER_ROW_CTAS=4"])
    assert variants == [Variant("rule", "embedded"), Variant("split4", "embedded", {"POOLER_CONSUMER_ROW_CTAS": "4"})]
    for bad_env in ("other:X=1", "split4:X", "split4"):
        try:
            parse_variants(["rule=embedded", "split4=embedded"], [bad_env])
        except SystemExit:
            continue
        raise AssertionError(f"--env {bad_env} was accepted")
    variants = parse_variants(["old=embedded", "now=embedded"], [], [f"old:{sys.executable}"])
    assert variants[0].bench == sys.executable and variants[1].bench is None, variants
    for bad_bench in ("other:" + sys.executable, "old:/nonexistent/bench", "old"):
        try:
            parse_variants(["old=embedded", "now=embedded"], [], [bad_bench])
        except SystemExit:
            continue
        raise AssertionError(f"--bench-of {bad_bench} was accepted")
    print("compare_kernels: self-test passed")
    return False


def main():
    argv = sys.argv[1:]
    bench_args = []
    if "--" in argv:
        cut = argv.index("--")
        argv, bench_args = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every variant (default 3)")
    parser.add_argument("--bench", default="build/tools/pooler-kernel-bench", help="the bench to run")
    parser.add_argument("--out", help="where the runs' JSON and logs go (default: a new temporary folder)")
    parser.add_argument("--metric", help="the rows' field to compare")
    parser.add_argument("--env", action="append", default=[], metavar="NAME:VAR=VALUE",
                        help="an environment variable for one variant's runs (repeatable)")
    parser.add_argument("--bench-of", action="append", default=[], metavar="NAME:PATH",
                        help="another build's bench for one variant (repeatable)")
    parser.add_argument("--summarize", metavar="DIR", help="only print the table of the runs in DIR")
    parser.add_argument("--self-test", action="store_true", help="check the summary on made-up runs")
    parser.add_argument("variants", nargs="*", metavar="NAME=FOLDER")
    args = parser.parse_args(argv)
    if args.self_test:
        return 1 if self_test() else 0
    if args.summarize:
        return 1 if summarize(args.summarize, args.metric) else 0
    if args.rounds < 1:
        raise SystemExit(f"compare_kernels: --rounds {args.rounds}: expected at least 1")
    return 1 if run(args, bench_args) else 0


if __name__ == "__main__":
    sys.exit(main())
