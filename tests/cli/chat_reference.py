"""The tokens and loss mask of a chat conversation as DESIGN.md §6 "Chat data" defines them,
computed from transformers' renderings and tokens (apply_chat_template, offsets): the reference
that tests/cli/test_chat_data.sh and test_preference_data.sh hold ft's shards to. Imported by
their Python (sys.path gets tests/cli), in a venv with transformers."""


def ids_of(x):
    """apply_chat_template(tokenize=True) gives a list or a BatchEncoding."""
    return list(x["input_ids"]) if hasattr(x, "keys") else list(x)


def reference(tok, msgs, masked=None):
    """(ids, mask) of the conversation `msgs`: ids are apply_chat_template(tokenize=True); the
    mask is the rule of DESIGN.md §6 for the assistant messages whose indices are in `masked`
    (all of them when None): for each, the bytes that change when its content is replaced by
    "A" and by "B", the tokens overlapping them, and the special token right after."""
    ids = ids_of(tok.apply_chat_template(msgs, tokenize=True))
    text = tok.apply_chat_template(msgs, tokenize=False)
    r = text.encode("utf-8")
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    assert enc["input_ids"] == ids
    added = {i: a for i, a in tok.backend_tokenizer.get_added_tokens_decoder().items()}
    # Each token's bytes of R: its offsets (characters of the text, through the normalizer)
    # in bytes.
    byte_at = [0]
    for c in text:
        byte_at.append(byte_at[-1] + len(c.encode("utf-8")))
    spans = [(byte_at[b], byte_at[e]) for b, e in enc["offset_mapping"]]
    mask = [0] * len(ids)
    for i, m in enumerate(msgs):
        if m["role"] != "assistant" or (masked is not None and i not in masked):
            continue
        start, min_suffix = len(r), len(r)
        for x in ("A", "B"):
            alt = [dict(mm) for mm in msgs]
            alt[i]["content"] = x
            rx = tok.apply_chat_template(alt, tokenize=False).encode("utf-8")
            p = 0
            while p < min(len(r), len(rx)) and r[p] == rx[p]:
                p += 1
            s = 0
            while s < min(len(r), len(rx)) - p and r[-1 - s] == rx[-1 - s]:
                s += 1
            start, min_suffix = min(start, p), min(min_suffix, s)
        end = len(r) - min_suffix
        for k in range(len(ids)):
            if start < end and spans[k][0] < end and spans[k][1] > start:
                mask[k] = 1
        k = next((k for k in range(len(ids)) if spans[k][0] >= end), None)
        if k is not None and added.get(ids[k]) is not None and added[ids[k]].special:
            mask[k] = 1
    return ids, mask
