#!/usr/bin/python3
"""Check that transformers reads an `ft export` folder as ft does (DESIGN.md §8).

    PY hf_tokenizer_check.py EXPORT_DIR --shards DIR --docs FILE [--format text|jsonl]
        [--field text] [--prompt TEXT ...] [--max-new-tokens N]

1. Tokenization: every document of FILE, read as `ft tokenize` reads it (text: paragraphs
   separated by blank lines; JSONL: one object per line, field --field), is tokenized with
   `AutoTokenizer.from_pretrained(EXPORT_DIR)`; the ids plus EOS must equal that document's ids
   in the shards of DIR (ft tokenize wrote them from FILE), for every document.
2. Generation (when transformers can use torch): greedy `generate` from each --prompt must end
   with eos_token_id before --max-new-tokens, with the ids the export's configs carry. The model
   must have been trained to close documents with EOS (the CLI test trains on short ones).

Needs transformers, tokenizers and h5py; torch only for 2. Prints one summary line per part and
exits 1 on the first mismatch, naming the document.
"""

import argparse
import glob
import json
import os
import sys

import h5py
import numpy as np


def read_documents(path, fmt, field):
    """Documents as ft tokenize's DocumentReader yields them (lib/data/tokenize.cpp)."""
    if fmt == "auto":
        fmt = "jsonl" if os.path.splitext(path)[1] in (".jsonl", ".json") else "text"
    data = open(path, "rb").read().decode("utf-8")
    lines = data.split("\n")
    if data.endswith("\n"):
        lines.pop()  # getline yields no empty line after a final newline
    blank = lambda s: all(c in " \t\r\f\v" for c in s)
    docs, doc = [], None
    for line in lines:
        if line.endswith("\r"):
            line = line[:-1]
        if fmt == "jsonl":
            if not blank(line):
                docs.append(json.loads(line)[field])
            continue
        if blank(line):
            if doc is not None:
                docs.append(doc)
                doc = None
            continue
        doc = line if doc is None else doc + "\n" + line
    if doc is not None:
        docs.append(doc)
    return docs


def read_shard_documents(folder):
    """Token ids of each document of the shards in name order, and the shards' bos/eos ids."""
    files = sorted(glob.glob(os.path.join(folder, "*.h5")))
    if not files:
        sys.exit(f"{folder}: no *.h5 shards")
    docs, attrs = [], None
    for f in files:
        with h5py.File(f, "r") as h:
            tokens = np.asarray(h["tokens"][:], dtype=np.int64)
            offsets = [int(x) for x in h["doc_offsets"][:]] + [tokens.size]
            a = (int(h.attrs["bos_id"]), int(h.attrs["eos_id"]))
            if attrs is not None and a != attrs:
                sys.exit(f"{f}: bos/eos ids {a} differ from the other shards' {attrs}")
            attrs = a
            docs += [tokens[offsets[i]:offsets[i + 1]].tolist() for i in range(len(offsets) - 1)]
    return docs, attrs


def check_tokenizer(export_dir, docs, shard_docs, bos_id, eos_id):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(export_dir)
    if len(docs) != len(shard_docs):
        sys.exit(f"FAIL: {len(docs)} documents in the input, {len(shard_docs)} in the shards")
    if (tok.bos_token_id, tok.eos_token_id) != (None if bos_id < 0 else bos_id,
                                                None if eos_id < 0 else eos_id):
        sys.exit(f"FAIL: AutoTokenizer has bos/eos {tok.bos_token_id}/{tok.eos_token_id}, "
                 f"the shards {bos_id}/{eos_id}")
    for i, (doc, want) in enumerate(zip(docs, shard_docs)):
        got = tok(doc)["input_ids"] + ([eos_id] if eos_id >= 0 else [])
        if got != want:
            k = next((j for j in range(min(len(got), len(want))) if got[j] != want[j]),
                     min(len(got), len(want)))
            sys.exit(f"FAIL: document {i} {doc[:60]!r}: AutoTokenizer gives {len(got)} ids, the "
                     f"shards {len(want)}; first difference at {k}: {got[k:k + 8]} vs "
                     f"{want[k:k + 8]}")
    print(f"ok: AutoTokenizer ({type(tok).__name__}) gives ft's ids for all {len(docs)} "
          f"documents (BOS {bos_id} added, EOS {eos_id} closes each in the shards)")
    return tok


def torch_usable():
    try:
        from transformers.utils import is_torch_available
        return is_torch_available()
    except ImportError:
        return False


def check_generate(export_dir, tok, prompts, max_new_tokens, eos_id):
    import torch
    import transformers.generation.utils as gen_utils
    from transformers import AutoModelForCausalLM
    # Debian's torch 1.13 on Python 3.11 cannot import torch.distributed.fsdp (a dataclass
    # error), which generate probes only to learn whether the model is FSDP-wrapped: it is not.
    if hasattr(gen_utils, "is_fsdp_managed_module"):
        gen_utils.is_fsdp_managed_module = lambda module: False
    model = AutoModelForCausalLM.from_pretrained(export_dir)
    model.eval()
    gc = model.generation_config
    if gc.eos_token_id != eos_id:
        sys.exit(f"FAIL: generation_config eos_token_id {gc.eos_token_id}, expected {eos_id}")
    for p in prompts:
        enc = tok(p, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=gc.pad_token_id if gc.pad_token_id is not None
                                 else eos_id)
        new = out[0, enc["input_ids"].shape[1]:].tolist()
        text = tok.decode(out[0], skip_special_tokens=True)
        if not new or new[-1] != eos_id or len(new) >= max_new_tokens or eos_id in new[:-1]:
            sys.exit(f"FAIL: generate from {p!r} did not stop at EOS {eos_id} within "
                     f"{max_new_tokens} new tokens: {new} ({text!r})")
        print(f"ok: generate {p!r} -> {text!r}, stopped at EOS after {len(new)} tokens")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("export_dir")
    ap.add_argument("--shards", required=True, help="ft tokenize's output for --docs")
    ap.add_argument("--docs", required=True, help="the input ft tokenize read")
    ap.add_argument("--format", default="auto", choices=["auto", "text", "jsonl"])
    ap.add_argument("--field", default="text")
    ap.add_argument("--prompt", action="append", default=[])
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--require-generate", action="store_true",
                    help="fail, rather than skip part 2, when torch is not usable")
    args = ap.parse_args()

    import transformers
    print(f"transformers {transformers.__version__}")
    docs = read_documents(args.docs, args.format, args.field)
    shard_docs, (bos_id, eos_id) = read_shard_documents(args.shards)
    config = json.load(open(os.path.join(args.export_dir, "config.json")))
    for key, want in (("bos_token_id", bos_id), ("eos_token_id", eos_id)):
        if config.get(key, -1) != want:
            sys.exit(f"FAIL: config.json {key} {config.get(key)}, the shards say {want}")
    tok = check_tokenizer(args.export_dir, docs, shard_docs, bos_id, eos_id)
    if args.prompt:
        if torch_usable():
            check_generate(args.export_dir, tok, args.prompt, args.max_new_tokens, eos_id)
        elif args.require_generate:
            sys.exit("FAIL: transformers cannot use torch here; generate was not checked")
        else:
            print("skipped: generate (transformers cannot use torch here)")


if __name__ == "__main__":
    main()
