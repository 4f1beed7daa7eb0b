"""Counts compute-sanitizer findings per log, all of them and those in this project's code.

    python3 .ci/sanitizer_summary.py OUT/sanitize_<tool>_<suite>.log ...

A finding is one report: a line "========= <text>" (not indented) with the indented lines under
it. It is ours when the kernel it names ("at <kernel>+0x...") is in the library's namespace te::
(also mangled, _ZN2te), or, for a host-side finding with no kernel, when a host frame is; others (cuDNN's, PyTorch's kernels) are
listed by their first location so that each can be judged. Prints one line per log and exits
non-zero when any finding is ours, or when a log has no summary line (the run did not finish).
"""
import collections
import os
import re
import sys

PREFIX = "========= "
NOT_FINDINGS = ("ERROR SUMMARY", "RACECHECK SUMMARY", "LEAK SUMMARY", "COMPUTE-SANITIZER",
                "Target application returned", "This tool")
OURS = re.compile(r"\bte::|_ZN2te")
LOCATION = re.compile(r"\bat (.+?)(?: in |$)")


def findings(lines):
    current = None
    for line in lines:
        if not line.startswith("========="):
            continue
        body = line[len(PREFIX):] if line.startswith(PREFIX) else ""
        if body and not body[0].isspace():
            if current is not None:
                yield current
            current = None if body.startswith(NOT_FINDINGS) else [body.rstrip()]
        elif current is not None and body.strip():
            current.append(body.strip())
    if current is not None:
        yield current


def is_ours(rec) -> bool:
    """A finding in device code is ours when the kernel it names is (a cuDNN kernel launched
    from our host code is cuDNN's); a host-side finding (an API error) is ours when one of its
    host frames is."""
    kernel = next((l for l in rec[1:] if l.startswith("at ")), None)
    if kernel is not None:
        return bool(OURS.search(kernel))
    return any(OURS.search(l) for l in rec)


def summarize(path):
    with open(path, errors="replace") as f:
        lines = f.readlines()
    summary = [l[len(PREFIX):].strip() for l in lines
               if re.search(r"(ERROR|RACECHECK) SUMMARY", l)]
    ours, others = 0, collections.Counter()
    for rec in findings(lines):
        if is_ours(rec):
            ours += 1
        else:
            where = next((m.group(1) for l in rec[1:] for m in [LOCATION.search(l)] if m), rec[0])
            others[where[:100]] += 1
    return ours, others, summary


def main(paths):
    bad = False
    for path in paths:
        ours, others, summary = summarize(path)
        name = os.path.basename(path)
        status = summary[-1] if summary else "NO SUMMARY (run did not finish)"
        print(f"{name:34s} ours {ours:4d}  others {sum(others.values()):5d}  | {status}")
        for where, n in others.most_common(5):
            print(f"{'':34s}   other: {n:5d} x {where}")
        bad |= ours > 0 or not summary
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
