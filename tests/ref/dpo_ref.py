"""The float64 DPO reference of the DPO tests (tests/ref/test_dpo.py, tests/cli/test_dpo_trl.sh),
written here from the paper's formulas and ft's data rules (DESIGN.md §5 "Preference
optimization", §6 DPO's samples), on llama_ref's model. Debian's python3 and PyTorch 2 alike."""

import torch


def rows_of_sequences(seqs, T):
    """The two rows (ids, targets, mask) of a pair given as its two (tokens, loss_mask) sequences,
    as ft's loader makes them, or None when the pair is dropped (a sequence with fewer than 2
    tokens, or cut to T + 1 with no trained target among its first T)."""
    rows = []
    for tokens, mask in seqs:
        cut = len(tokens) > T + 1
        seq, m = list(tokens)[:T + 1], list(mask)[:T + 1]
        if len(seq) < 2 or (cut and sum(m[1:]) == 0):
            return None
        n = len(seq) - 1
        rows.append((seq[:-1] + [0] * (T - n), seq[1:] + [0] * (T - n), m[1:] + [0] * (T - n)))
    return rows


def rows_of(pair, T):
    """rows_of_sequences of a (prompt, chosen, rejected) pair of token lists, the completions'
    tokens trained."""
    prompt, chosen, rejected = pair
    return rows_of_sequences([(prompt + c, [0] * len(prompt) + [1] * len(c))
                              for c in (chosen, rejected)], T)


def logps(model, rows):
    """Sum of log p(target) over each row's masked targets: (len(rows),) float64."""
    ids = torch.tensor([r[0] for r in rows])
    tgt = torch.tensor([r[1] for r in rows])
    msk = torch.tensor([r[2] for r in rows], dtype=torch.float64)
    lp = torch.log_softmax(model.forward(ids), dim=-1)
    tok = lp.gather(-1, tgt[..., None])[..., 0]
    return (tok * msk).sum(-1), msk.sum(-1)


def dpo_losses(kind, beta, eps, pc, pr, rc, rr):
    z = (pc - rc) - (pr - rr)
    if kind == "sigmoid":
        return (-(1 - eps) * torch.nn.functional.logsigmoid(beta * z)
                - eps * torch.nn.functional.logsigmoid(-beta * z))
    if kind == "hinge":
        return torch.relu(1 - beta * z)
    return (z - 1 / (2 * beta)) ** 2


def figures(kind, beta, eps, lp, n, ref_lp):
    """The loss per pair and the metrics' per-pair values of rows (chosen, rejected, ...)."""
    pc, pr, rc, rr = lp[0::2], lp[1::2], ref_lp[0::2], ref_lp[1::2]
    if kind == "ipo":  # per-token means in the loss only; the metrics of the sums, as TRL's
        losses = dpo_losses(kind, beta, eps, pc / n[0::2], pr / n[1::2], rc / n[0::2],
                            rr / n[1::2])
    else:
        losses = dpo_losses(kind, beta, eps, pc, pr, rc, rr)
    rw_c, rw_r = beta * (pc - rc).detach(), beta * (pr - rr).detach()
    return losses, {"rewards_chosen": rw_c, "rewards_rejected": rw_r,
                    "reward_margin": rw_c - rw_r, "reward_accuracy": (rw_c > rw_r).double(),
                    "logps_chosen": pc.detach(), "logps_rejected": pr.detach()}


def reference_run(model, kept, vkept, steps, kind, beta, eps):
    """The float64 DPO of steps x 4 pairs, no shuffle; returns per step (loss, norm, metrics)
    and per evaluation step the eval figures."""
    params = {k: torch.nn.Parameter(v.detach().double()) for k, v in model.named().items()}
    model.p = params
    with torch.no_grad():
        ref_train = [logps(model, rows)[0] for rows in kept]
        ref_valid = [logps(model, rows)[0] for rows in vkept]
    decay = [p for p in params.values() if p.dim() >= 2]
    no_decay = [p for p in params.values() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=0.01, betas=(0.9, 0.95), eps=1e-8)
    N, G = len(kept), 4
    out, evals = [], {}
    for s in range(steps):
        idx = [(s * G + j) % N for j in range(G)]
        rows = [r for i in idx for r in kept[i]]
        ref_lp = torch.cat([ref_train[i] for i in idx])
        opt.zero_grad()
        lp, n = logps(model, rows)
        losses, m = figures(kind, beta, eps, lp, n, ref_lp)
        loss = losses.mean()
        loss.backward()
        norm = torch.sqrt(sum((p.grad ** 2).sum() for p in params.values())).item()
        opt.step()
        out.append((loss.item(), norm, {k: v.mean().item() for k, v in m.items()}, m))
        if vkept and (s + 1) % 2 == 0:
            with torch.no_grad():
                vrows = [r for rr in vkept for r in rr]
                lp, n = logps(model, vrows)
                losses, m = figures(kind, beta, eps, lp, n, torch.cat(ref_valid))
            evals[s + 1] = (losses.mean().item(), {k: v.mean().item() for k, v in m.items()})
    return out, evals
