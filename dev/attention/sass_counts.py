#!/usr/bin/env python3
"""Per-kernel SASS counts from `cuobjdump -sass` on stdin, for dev/attention/kernel_report.sh.

Prints one tab-separated row a kernel and architecture: arch, HMMA, LDSM, LDGSTS, loop, common,
mangled name. loop: the instructions of the kernel's longest loop (from a backward branch's
target to the branch). common: those of its basic blocks that hold no FSEL, an estimate of a
tile's path when it needs no masking (the fused attention kernels keep a masked copy of their
elementwise loops, chosen per tile, and only it selects with FSEL; for the forward the exp
blocks, which hold its -inf guard, are counted out too). 0 and 0 for a kernel without a loop.
"""
import re
import sys

INSN = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)([^;]*)")


def loop_counts(insns):
    """(loop length, FSEL-free part of it) of the longest backward branch's loop."""
    best = None
    for addr, op, rest in insns:
        m = re.search(r"(0x[0-9a-f]+)", rest) if op == "BRA" else None
        if m and int(m.group(1), 16) < addr:
            span = (int(m.group(1), 16), addr)
            if best is None or span[1] - span[0] > best[1] - best[0]:
                best = span
    if best is None:
        return 0, 0
    loop = [x for x in insns if best[0] <= x[0] <= best[1]]
    targets = set()
    for _, op, rest in loop:
        m = re.search(r"(0x[0-9a-f]+)", rest) if op == "BRA" else None
        if m:
            targets.add(int(m.group(1), 16))
    blocks, cur = [], []
    for addr, op, _ in loop:
        if addr in targets and cur:
            blocks.append(cur)
            cur = []
        cur.append(op)
        if op == "BRA":
            blocks.append(cur)
            cur = []
    if cur:
        blocks.append(cur)
    return len(loop), sum(len(b) for b in blocks if "FSEL" not in b)


def main():
    arch, name, insns = "", None, []

    def flush():
        if name is None:
            return
        ops = [op for _, op, _ in insns]
        loop, common = loop_counts(insns)
        print("\t".join([arch, str(ops.count("HMMA")), str(ops.count("LDSM")),
                         str(ops.count("LDGSTS")), str(loop), str(common), name]))

    for line in sys.stdin:
        m = re.search(r"code for (sm_[0-9a-z]+)", line)
        if m:
            flush()
            arch, name, insns = m.group(1), None, []
            continue
        m = re.search(r"Function : (\S+)", line)
        if m:
            flush()
            name, insns = m.group(1), []
            continue
        m = INSN.match(line)
        if m and name is not None:
            insns.append((int(m.group(1), 16), m.group(2), m.group(3)))
    flush()


if __name__ == "__main__":
    main()
