#!/usr/bin/python3
"""docs/benchmarks.md from the result files bench/all.sh writes.

  render.py result --name N --command C --date D --commit C --machine M \
      --load-before L --load-after L --exit RC --seconds S --quick 0|1 OUTPUT.txt > N.json
      one bench's machine-readable result: the header fields and its output,
      with the markdown tables it prints parsed into columns and rows
  render.py render RESULTS_DIR [--template bench/benchmarks.md.in] [--out FILE]
      fills the template: {{header}} with the run's command, dates, commit,
      machine and load; {{bench:NAME}} with NAME.json's command, date, commit,
      machine, load and output (a markdown table stays a table, other output
      goes in a code block); {{commands}} with every bench's command.

Every figure in the output comes from a result file: the renderer refuses a
template whose prose holds a measured-looking figure (a number with a unit
such as MiB, tok/s, x or %, a date or a UTC time), a placeholder it cannot
fill, a missing result file, and a result file no placeholder uses. A quick
run (QUICK=1 bash bench/all.sh) says so in the header and is never written
to docs/benchmarks.md. Python 3 standard library only.
"""
import argparse
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
FIELDS = ("name", "command", "date", "commit", "machine", "load_before", "load_after", "exit", "seconds", "quick")
PLACEHOLDER = re.compile(r"\{\{([a-z]+)(?::([A-Za-z0-9_.-]+))?\}\}")
# a figure that only a measurement gives: a number with a unit, a decimal,
# a date, a clock time (settings in `code` spans are not checked)
FIGURE = re.compile(r"(?<![\w.@^=/-])\d[\d,]*(\.\d+)?\s?(MiB|GiB|KiB|MB/s|GB/s|GFLOP/s|TFLOP/s|tok/s|tokens/s"
                    r"|ms\b|s/step|%|x\b)|(?<![\w.@^=/-])\d+\.\d+(?![\d.])"
                    r"|\b20\d\d-[01]\d-[0-3]\d\b|\b[0-2]\d:[0-5]\d\b")
QUICK_NOTE = "QUICK RUN (QUICK=1: fewer steps and rounds, smallest models): a pipeline check, not figures to quote"


def die(msg):
    print("render: error: " + msg, file=sys.stderr)
    sys.exit(1)


def parse_output(text):
    """The output as blocks: {"table": {"columns": [...], "rows": [[...]]}}
    for each markdown table the bench prints, {"text": [lines]} otherwise."""
    blocks = []
    for line in text.rstrip("\n").split("\n") if text.strip() else []:
        is_row = line.startswith("|") and line.rstrip().endswith("|")
        cells = [c.strip() for c in line.strip()[1:-1].split("|")] if is_row else None
        last = blocks[-1] if blocks else None
        if is_row and last and "table" in last:
            if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                last["table"]["rows"].append(cells)
        elif is_row:
            blocks.append({"table": {"columns": cells, "rows": []}})
        elif last and "text" in last:
            last["text"].append(line)
        else:
            blocks.append({"text": [line]})
    return blocks


def cmd_result(a):
    try:
        text = open(a.output, errors="replace").read()
    except OSError as e:
        die("cannot read %s: %s" % (a.output, e.strerror))
    r = {"name": a.name, "command": a.command, "date": a.date, "commit": a.commit, "machine": a.machine,
         "load_before": a.load_before, "load_after": a.load_after, "exit": a.exit, "seconds": a.seconds,
         "quick": bool(a.quick), "output": parse_output(text)}
    json.dump(r, sys.stdout, indent=1)
    sys.stdout.write("\n")


def load_results(d):
    res = {}
    for f in sorted(os.listdir(d)):
        if not f.endswith(".json") or f == "run.json":
            continue
        try:
            r = json.load(open(os.path.join(d, f)))
        except (OSError, ValueError) as e:
            die("%s: not a result file (%s)" % (os.path.join(d, f), e))
        miss = [k for k in FIELDS if k not in r] + ([] if "output" in r else ["output"])
        if miss:
            die("%s: result file lacks %s" % (os.path.join(d, f), ", ".join(miss)))
        if r["name"] + ".json" != f:
            die("%s: names bench '%s'" % (os.path.join(d, f), r["name"]))
        res[r["name"]] = r
    return res


def head_line(r):
    s = "%s, commit %s, %s; load %s before, %s after; %s s" % (
        r["date"], r["commit"], r["machine"], r["load_before"], r["load_after"], r["seconds"])
    return s + ("" if r["exit"] == 0 else "; FAILED, exit %d" % r["exit"])


def md_table(t):
    out = ["| " + " | ".join(t["columns"]) + " |", "|" + "---|" * len(t["columns"])]
    out += ["| " + " | ".join(row) + " |" for row in t["rows"]]
    return out


def bench_block(r):
    out = ["```", "$ " + r["command"], "# " + head_line(r)]
    fenced = True
    for b in r["output"]:
        if "table" in b:
            if fenced:
                out.append("```")
            out += [""] + md_table(b["table"]) + [""]
            fenced = False
        else:
            lines = b["text"]
            if not fenced:
                if not any(l.strip() for l in lines):
                    continue
                out.append("```")
            out += lines
            fenced = True
    if fenced:
        out.append("```")
    while out and out[-1] == "":
        out.pop()
    return "\n".join(out)


def header_block(results, run):
    rs = list(results.values())
    quick = any(r["quick"] for r in rs)
    dates = sorted(r["date"] for r in rs)
    loads = [x for r in rs for x in (r["load_before"], r["load_after"])]
    first = [float(x.split()[0]) for x in loads if x.split()]
    fails = [r["name"] for r in rs if r["exit"] != 0]
    machines = sorted(set(r["machine"] for r in rs))
    commits = sorted(set(r["commit"] for r in rs))
    lines = []
    if quick:
        lines += ["> **%s.**" % QUICK_NOTE, ""]
    lines += ["Generated by `bench/render.py` from the result files of `%s` in `%s`:" % (
                  run.get("command", "bash bench/all.sh"), run.get("dir", "?")),
              "%d benchmarks run between %s and %s, commit %s, on %s; load average (1 min) %s to %s over the run%s." % (
                  len(rs), dates[0], dates[-1], ", ".join(commits), "; ".join(machines),
                  min(first) if first else "?", max(first) if first else "?",
                  "" if not fails else "; FAILED: " + ", ".join(fails))]
    return "\n".join(lines)


def commands_block(results, order):
    w = max(len(n) for n in order)
    return "\n".join(["```"] + ["%-*s  %s" % (w, n, results[n]["command"]) for n in order] + ["```"])


def cmd_render(a):
    if not os.path.isdir(a.results):
        die("%s is not a directory of result files" % a.results)
    try:
        tpl = open(a.template).read()
    except OSError as e:
        die("cannot read template %s: %s" % (a.template, e.strerror))
    results = load_results(a.results)
    run = {}
    if os.path.exists(os.path.join(a.results, "run.json")):
        run = json.load(open(os.path.join(a.results, "run.json")))
    run.setdefault("dir", a.results)
    # prose may explain, never quote a figure: those come from result files
    comment = False
    for i, line in enumerate(tpl.split("\n"), 1):
        prose = re.sub(r"`[^`]*`", "", PLACEHOLDER.sub("", line))
        if comment or "<!--" in prose:
            comment = "-->" not in prose
            continue
        m = FIGURE.search(prose)
        if m:
            die("%s:%d: '%s' looks like a measured figure; figures come from result files only" % (
                a.template, i, m.group(0)))
    # the template's own comments are notes for its editors, not output
    tpl = re.sub(r"<!--.*?-->\n?", "", tpl, flags=re.S)
    used = [m.group(2) for m in PLACEHOLDER.finditer(tpl) if m.group(1) == "bench"]
    for n in used:
        if n not in results:
            die("%s has no result file %s.json for {{bench:%s}}" % (a.results, n, n))
    unused = sorted(set(results) - set(used))
    if unused:
        die("result files without a {{bench:NAME}} in %s: %s" % (a.template, ", ".join(unused)))
    if not results:
        die("%s holds no result files" % a.results)
    quick = any(r["quick"] for r in results.values())
    out_path = os.path.abspath(a.out) if a.out else None
    if quick and out_path == os.path.join(REPO, "docs", "benchmarks.md"):
        die("a quick run (QUICK=1) is never written to docs/benchmarks.md; write it under bench-results/")

    def fill(m):
        kind, arg = m.group(1), m.group(2)
        if kind == "bench" and arg:
            return bench_block(results[arg])
        if kind == "header" and not arg:
            return header_block(results, run)
        if kind == "commands" and not arg:
            return commands_block(results, used)
        return m.group(0)
    doc = ("<!-- Generated by bench/render.py from %s and the result files in %s: edit the template, "
           "not this file. -->\n" % (os.path.relpath(a.template, REPO), run["dir"])) + PLACEHOLDER.sub(fill, tpl)
    left = PLACEHOLDER.search(doc) or re.search(r"\{\{[^}]*\}\}", doc)
    if left:
        die("placeholder %s left unfilled (known: {{header}}, {{commands}}, {{bench:NAME}})" % left.group(0))
    if out_path:
        tmp = out_path + ".tmp"
        open(tmp, "w").write(doc)
        os.replace(tmp, out_path)
    else:
        sys.stdout.write(doc)


def main():
    p = argparse.ArgumentParser(description="docs/benchmarks.md from bench/all.sh's result files")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("result", help="one bench's output as a JSON result file (stdout)")
    for k in ("name", "command", "date", "commit", "machine", "load-before", "load-after"):
        r.add_argument("--" + k, required=True)
    r.add_argument("--exit", type=int, required=True)
    r.add_argument("--seconds", type=int, required=True)
    r.add_argument("--quick", type=int, choices=(0, 1), default=0)
    r.add_argument("output", help="the bench's output file")
    d = sub.add_parser("render", help="fill the template from a directory of result files")
    d.add_argument("results")
    d.add_argument("--template", default=os.path.join(HERE, "benchmarks.md.in"))
    d.add_argument("--out", help="file to write (default: stdout)")
    a = p.parse_args()
    cmd_result(a) if a.cmd == "result" else cmd_render(a)


if __name__ == "__main__":
    main()
