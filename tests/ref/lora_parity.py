"""LoRA (issue 28 point 2) in ft against PEFT + transformers, run by tests/cli/test_lora_peft.sh
in a venv that has both (common.sh: hf_peft_spec, transformers 4.46.3 on Debian's torch 1.13;
the qwen3 case needs hf_torch2_spec's transformers 5 on torch 2, which has Qwen3ForCausalLM):
    PYTHON tests/ref/lora_parity.py BUILD_DIR SOURCE_DIR TMP_DIR [--reference-only]
FT_LORA_CASES=a,b runs only those cases (llama, qwen2_tied, qwen3, llama_mts, qwen2_tied_mts);
the default is llama and qwen2_tied. --reference-only runs the PyTorch side alone (no ft is needed): the 8 reference
losses and gradient norms of each case and its discriminating checks.

Per case, on a small random model (arch_parity.py's sizes: dim 64, 2 layers, 4 heads / 2 kv
heads, vocab 256; qwen3 with head_dim 32):
1. The base: built by transformers (LlamaForCausalLM, Qwen2ForCausalLM with tied embeddings,
   Qwen3ForCausalLM; eager attention, fp32), biases and norm weights moved off their initial
   zeros and ones, save_pretrained. The adapter: PEFT's LoraConfig (r 4, lora_alpha 8,
   lora_dropout 0; target_modules: llama all seven projections by name, qwen2_tied q_proj,
   v_proj and down_proj with use_rslora, qwen3 "all-linear"), get_peft_model, then A and B set
   to random values from a fixed seed (B != 0: with PEFT's default B = 0 the first step's
   gradient of A is zero, and a wrong one would go unseen), save_pretrained. The _mts cases
   (issue 28 point 4; PEFT with ensure_weight_tying, so peft >= 0.17: the torch 2 venv) also
   train modules_to_save [embed_tokens, lm_head] whole: llama's two matrices, and qwen2_tied's
   one shared table (ensure_weight_tying=True); their copies are moved off the base's values
   before saving, so an ft that read the base's instead fails. The reference is
   what ft reads: the base folder through AutoModelForCausalLM and the adapter folder through
   PeftModel.from_pretrained(is_trainable=True).
   Asserted of the reference: PEFT's scaling is alpha / r (alpha / sqrt(r) with rsLoRA), the
   trainable parameters are exactly the A and B of the target modules (and the modules' copies),
   and the loss of step 1's batch moves by far more than the bounds below when the adapter is
   disabled (so an ft that ignored the adapter fails), with rsLoRA when the scaling is alpha / r
   instead (so an ft that ignored use_rslora fails), and with modules_to_save when the modules
   hold the base's values (so an ft that did not load them fails).
2. `ft train` with model.from the base and adapter.type=lora, adapter.r, adapter.alpha,
   adapter.dropout=0, adapter.target_modules, adapter.use_rslora and adapter.from the adapter
   folder as overrides, 8 steps (AdamW with weight decay on the adapter's matrices, warmup then
   cosine, clipping over the adapter's gradients active on some steps and not others, a loss
   mask, two micro-batches per step), against the reference's torch.optim.AdamW steps over its
   trainable parameters (test_llama_numerics.torch_step): step 1's loss and gradient norm
   within 1e-5 relative (fp32 on both sides, different summation orders: test_llama_numerics'
   single-step bound), every step's loss and gradient norm within 1e-4 (its multi-step bound:
   Adam's normalisation amplifies rounding a little each step).
3. The base stays frozen: in the reference, every base tensor keeps its bits through the 8 steps
   (the reference itself is sound); in ft, every base tensor of its parameters after the last
   step (FT_TEST_DUMP_PARAMS) is the base folder's, bit for bit, but the modules trained whole,
   which moved (model.norm.weight, in the head's group, among the kept).
4. ft's checkpoint of the adapter run holds the adapter alone, and `ft export` of it is a PEFT
   folder that PEFT applies to the base with the reference's trained A and B; `ft export --merge`
   is the model that PEFT's merge_and_unload() makes of them (check_ft_checkpoint_base).
"""

import json
import math
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref as ref  # noqa: E402
import test_llama_numerics as num  # noqa: E402  (its BUILD and SOURCE are argv 1 and 2 here too)

TMP = sys.argv[3]
REFERENCE_ONLY = "--reference-only" in sys.argv[4:]
check = num.check
SIZES = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96, vocab_size=256,
             max_seq_len=64, norm_eps=1e-6)
PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# The LoRA of every case: PEFT's LoraConfig fields, and ft's recipe keys of the same meaning.
R, ALPHA = 4, 8
# label: (model class, tied embeddings, target_modules, use_rslora, modules_to_save)
MTS = ["embed_tokens", "lm_head"]
CASES = {
    "llama": ("LlamaForCausalLM", False, PROJECTIONS, False, []),
    "qwen2_tied": ("Qwen2ForCausalLM", True, ["q_proj", "v_proj", "down_proj"], True, []),
    "qwen3": ("Qwen3ForCausalLM", False, "all-linear", False, []),
    "llama_mts": ("LlamaForCausalLM", False, ["q_proj", "v_proj"], False, MTS),
    "qwen2_tied_mts": ("Qwen2ForCausalLM", True, ["q_proj", "v_proj", "down_proj"], True, MTS),
}
DEFAULT_CASES = ["llama", "qwen2_tied"]  # qwen3 needs transformers >= 4.51, so torch >= 2
# Training: arch_parity.py's schedule and batches over 8 steps. clip: between the reference's
# gradient norms, so that clipping acts on some steps and not on others (asserted).
T, MICRO, GLOB, STEPS = 16, 2, 4, 8
LR, WD, WARM, MIN_LR = 2e-3, 0.1, 3, 2e-4
CLIP = {"llama": 2.2, "qwen2_tied": 2.1, "qwen3": 1.85, "llama_mts": 2.8, "qwen2_tied_mts": 4.2}


class PeftRef:
    """A PEFT model with test_llama_numerics' model interface: p holds the trainable parameters
    (what torch_step clips and torch_adamw updates), loss_sum the masked cross-entropy sum."""

    def __init__(self, model):
        self.model = model
        self.p = {n: p for n, p in model.named_parameters() if p.requires_grad}

    def named(self):
        return dict(self.p)

    def loss_sum(self, ids, targets, mask):
        logits = self.model(input_ids=ids).logits
        ce = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
        return (ce * mask.reshape(-1).float()).sum()

    def lora_layers(self):
        import peft
        return [m for m in self.model.modules() if isinstance(m, peft.tuners.lora.LoraLayer)]

    def saved_modules(self):
        """PEFT's ModulesToSaveWrapper of each module trained whole."""
        import peft
        return [m for m in self.model.modules() if isinstance(m, peft.utils.ModulesToSaveWrapper)]


def build_base(label, case, seed):
    """Section 1's base folder; returns its path."""
    import transformers
    cls_name, tie, _, _, _ = CASES[label]
    common = dict(vocab_size=SIZES["vocab_size"], hidden_size=SIZES["dim"],
                  intermediate_size=SIZES["ffn_dim"], num_hidden_layers=SIZES["n_layers"],
                  num_attention_heads=SIZES["n_heads"], num_key_value_heads=SIZES["n_kv_heads"],
                  max_position_embeddings=SIZES["max_seq_len"], rms_norm_eps=SIZES["norm_eps"],
                  rope_theta=10000.0, tie_word_embeddings=tie, initializer_range=0.1,
                  attn_implementation="eager")
    if cls_name == "LlamaForCausalLM":
        config = transformers.LlamaConfig(**common)
    elif cls_name == "Qwen2ForCausalLM":
        config = transformers.Qwen2Config(**common, use_sliding_window=False)
    else:
        config = transformers.Qwen3Config(**common, head_dim=32, use_sliding_window=False,
                                          sliding_window=None, attention_bias=False)
    torch.manual_seed(seed)
    m = getattr(transformers, cls_name)(config).float()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith(".bias") or name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn(p.shape))
    hf = os.path.join(case, "hf")
    m.save_pretrained(hf, safe_serialization=True)
    return hf


def load_base(hf):
    import transformers
    m = transformers.AutoModelForCausalLM.from_pretrained(hf, attn_implementation="eager")
    return m.float()


def make_adapter(label, case, hf, seed):
    """Section 1's adapter folder, made by PEFT from the base folder; returns its path."""
    import peft
    _, tie, targets, rslora, mts = CASES[label]
    # Modules trained whole on tied embeddings: the shared table, as ft trains it.
    extra = dict(modules_to_save=list(mts)) if mts else {}
    if mts and tie:
        extra["ensure_weight_tying"] = True
    config = peft.LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=targets,
                             use_rslora=rslora, bias="none", task_type="CAUSAL_LM", **extra)
    model = peft.get_peft_model(load_base(hf), config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_A" in name:  # about PEFT's Kaiming-uniform size, bound 1/sqrt(in)
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
            elif "lora_B" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif "modules_to_save" in name:  # off the base's values, by about their size
                p.add_(p.std() * torch.randn(p.shape, generator=g))
    adapter = os.path.join(case, "adapter")
    model.save_pretrained(adapter)
    return adapter


def reference(label, case, seed):
    """Section 1: the folders, the reference model and its checks. Returns (base folder,
    adapter folder, data folder, reference model, shards)."""
    import peft
    _, tie, targets, rslora, mts = CASES[label]
    hf = build_base(label, case, seed)
    adapter = make_adapter(label, case, hf, seed + 100)
    saved = json.load(open(os.path.join(adapter, "adapter_config.json")))
    model = PeftRef(peft.PeftModel.from_pretrained(load_base(hf), adapter, is_trainable=True))
    want_scale = ALPHA / math.sqrt(R) if rslora else ALPHA / R
    layers = model.lora_layers()
    scales = {m.scaling["default"] for m in layers}
    check(scales == {want_scale} and saved["use_rslora"] == rslora,
          f"{label}: PEFT scales by {sorted(scales)}, alpha/{'sqrt(r)' if rslora else 'r'} = "
          f"{want_scale}")
    sites = PROJECTIONS if targets == "all-linear" else targets
    want = {f"base_model.model.model.layers.{i}.{'self_attn' if s[0] in 'qkvo' else 'mlp'}.{s}."
            f"lora_{ab}.default.weight"
            for i in range(SIZES["n_layers"]) for s in sites for ab in "AB"}
    # The modules' copies (tied: one, the embedding's, which lm_head's shares).
    wrapped = {"embed_tokens": "base_model.model.model.embed_tokens.modules_to_save.default.weight",
               "lm_head": "base_model.model.lm_head.modules_to_save.default.weight"}
    want |= {wrapped[m] for m in (mts[:1] if tie else mts)}
    check(set(model.p) == want and all(p.dim() == 2 for p in model.p.values()),
          f"{label}: the trainable parameters are the {len(want)} A and B matrices of "
          f"{'all-linear = ' if targets == 'all-linear' else ''}{sorted(sites)}"
          + (f" and the copies of {mts}" + (" (tied: one table)" if tie else "") if mts else "")
          + ("" if set(model.p) == want else f" (differ: {sorted(set(model.p) ^ want)[:3]})"))
    data, shards = num.make_data(case, "data", SIZES["vocab_size"], 12 * T + 1, 2, seed + 10,
                                 with_mask=True)
    # The discriminating checks, on step 1's batch.
    ids, tgt, msk = num.batch_tensors(ref.samples_no_shuffle(shards, T)[:GLOB])
    count = msk.sum().item()
    with torch.no_grad():
        loss = (model.loss_sum(ids, tgt, msk) / count).item()
        with model.model.disable_adapter():
            base = (model.loss_sum(ids, tgt, msk) / count).item()
    gap = abs(base - loss) / abs(loss)
    check(gap > 1e-3, f"{label}: step 1's loss with the adapter {loss:.6f}, without it "
                      f"{base:.6f}: {gap:.1e} apart, far beyond the bounds (1e-5, 1e-4)")
    if rslora:
        with torch.no_grad():
            for m in layers:
                m.scaling["default"] = ALPHA / R
            plain = (model.loss_sum(ids, tgt, msk) / count).item()
            for m in layers:
                m.scaling["default"] = want_scale
        gap = abs(plain - loss) / abs(loss)
        check(gap > 1e-3, f"{label}: with alpha/r instead of rsLoRA's alpha/sqrt(r) the loss "
                          f"is {plain:.6f}, {gap:.1e} away, far beyond the bounds")
    if mts:
        wrappers = model.saved_modules()
        with torch.no_grad():
            kept = [m.modules_to_save["default"].weight.clone() for m in wrappers]
            for m in wrappers:
                m.modules_to_save["default"].weight.copy_(m.original_module.weight)
            as_base = (model.loss_sum(ids, tgt, msk) / count).item()
            for m, w in zip(wrappers, kept):
                m.modules_to_save["default"].weight.copy_(w)
        gap = abs(as_base - loss) / abs(loss)
        check(gap > 1e-3 and len(wrappers) == len(mts),
              f"{label}: with the base's values in the {len(wrappers)} modules trained whole the "
              f"loss is {as_base:.6f}, {gap:.1e} away, far beyond the bounds")
    return hf, adapter, data, model, shards


def reference_steps(label, model, shards):
    """The reference's STEPS optimizer steps (section 2). Returns (losses, grad norms) and
    asserts that its base tensors kept their bits (section 3)."""
    frozen = {n: p.detach().clone() for n, p in model.model.named_parameters()
              if not p.requires_grad}
    start = {n: p.detach().clone() for n, p in model.p.items()}
    samples = ref.samples_no_shuffle(shards, T)
    opt = num.torch_adamw(model.named(), LR, (0.9, 0.95), 1e-8, WD)
    losses, norms = [], []
    for s in range(STEPS):
        for g in opt.param_groups:
            g["lr"] = num.cosine_lr(s, LR, WARM, STEPS, MIN_LR)
        batch = num.batch_tensors([samples[(s * GLOB + i) % len(samples)] for i in range(GLOB)])
        total, norm = num.torch_step(model, opt, batch, MICRO, CLIP[label])
        losses.append(total)
        norms.append(norm)
    kept = all(torch.equal(p, frozen[n]) for n, p in model.model.named_parameters()
               if n in frozen)
    moved = all(not torch.equal(p, start[n]) for n, p in model.p.items())
    check(kept and moved and len(frozen) > 0,
          f"{label}: reference: the {len(frozen)} base tensors kept their bits over {STEPS} "
          f"steps, all {len(start)} adapter tensors moved")
    clipped = sum(n > CLIP[label] for n in norms)
    check(0 < clipped < STEPS, f"{label}: reference: clipping at {CLIP[label]} acted on "
                               f"{clipped} of {STEPS} steps (both branches)")
    return losses, norms


def ft_run(label, case, hf, adapter, data):
    """Section 2's `ft train`; returns the metrics lines, or None."""
    _, _, targets, rslora, mts = CASES[label]
    metrics = os.path.join(case, "metrics.jsonl")
    optimizer = f"optimizer: {{lr: {LR}, betas: [0.9, 0.95], eps: 1.0e-8, weight_decay: {WD}}}"
    extra = (f"scheduler: {{name: cosine, warmup_steps: {WARM}, min_lr: {MIN_LR}}}\n"
             f"logging: {{every_steps: 1, metrics: {metrics}}}\n"
             f"checkpoint: {{dir: {case}/ckpt, every_steps: {STEPS}}}\n")
    rpath = os.path.join(case, "train.yaml")
    num.recipe_yaml(rpath, hf, data, T, MICRO, GLOB, extra, optimizer)
    modules = targets if isinstance(targets, str) else "[" + ",".join(targets) + "]"
    os.environ["FT_TEST_DUMP_PARAMS"] = os.path.join(case, "params")
    lines = num.ft_train(label, rpath, metrics, f"training.steps={STEPS}",
                         f"training.grad_clip={CLIP[label]}", "adapter.type=lora",
                         f"adapter.r={R}", f"adapter.alpha={ALPHA}", "adapter.dropout=0",
                         f"adapter.target_modules={modules}",
                         f"adapter.use_rslora={str(rslora).lower()}", f"adapter.from={adapter}",
                         f"adapter.modules_to_save=[{','.join(mts)}]", f"model.from={hf}")
    del os.environ["FT_TEST_DUMP_PARAMS"]
    return lines


def compare(label, lines, losses, norms):
    """Section 2's bounds."""
    ft_loss = {l["step"] - 1: l["loss"] for l in lines if "loss" in l}
    ft_norm = {l["step"] - 1: l["grad_norm"] for l in lines if "grad_norm" in l}
    missing = [s + 1 for s in range(STEPS) if s not in ft_loss or s not in ft_norm]
    if missing:
        check(False, f"{label}: ft metrics lack steps {missing}")
        return
    rel = [abs(ft_loss[s] - losses[s]) / abs(losses[s]) for s in range(STEPS)]
    nrel = [abs(ft_norm[s] - norms[s]) / norms[s] for s in range(STEPS)]
    check(rel[0] <= 1e-5 and nrel[0] <= 1e-5,
          f"{label}: step 1 loss ft {ft_loss[0]:.8f} torch {losses[0]:.8f} rel {rel[0]:.1e}, "
          f"grad_norm ft {ft_norm[0]:.7f} torch {norms[0]:.7f} rel {nrel[0]:.1e}")
    check(max(rel) <= 1e-4 and max(nrel) <= 1e-4,
          f"{label}: {STEPS} steps, loss within {max(rel):.1e}, grad_norm within "
          f"{max(nrel):.1e} (bound 1e-4)")


def check_ft_base_kept(label, case, hf):
    """Section 3: ft's parameters after the last step (FT_TEST_DUMP_PARAMS, one process: whole
    tensors under their HF names) hold every base tensor with the base folder's bits."""
    _, tie, _, _, mts = CASES[label]
    base = ref.read_safetensors(os.path.join(hf, "model.safetensors"))
    dumped = ref.read_safetensors(os.path.join(case, "params", "rank_0.safetensors"))
    missing = sorted(set(base) - set(dumped))
    changed = sorted(n for n in base if n in dumped and not torch.equal(base[n], dumped[n]))
    whole = sorted({"embed_tokens": "model.embed_tokens.weight", "lm_head": "lm_head.weight"}[m]
                   for m in (mts[:1] if tie else mts))
    check(not missing and changed == whole,
          f"{label}: ft kept all {len(base) - len(whole)} base tensors bit for bit"
          + (f", trained {whole} whole" if whole else "")
          + (f" (missing {missing[:3]}, changed {changed[:3]})"
             if missing or changed != whole else ""))


def check_ft_checkpoint_base(label, case, hf, model, shards):
    """Section 4: ft's checkpoint of the adapter run, and its export.
    - The manifest of the last step names every model group frozen with frozen.from = hf
      (DESIGN.md §8), and its pieces are of the adapter's groups alone (A and B with their AdamW
      moments): no base tensor is stored.
    - `ft export` gives a PEFT folder that PeftModel.from_pretrained applies to the base folder,
      whose A and B are the reference's after STEPS steps within section 2's multi-step bound
      (1e-4 of each tensor's largest magnitude): the same names and shapes, and ft's q and k
      rows in the HF order PEFT's are (a permutation would fail the bound).
    - `ft export --merge` gives a model folder AutoModelForCausalLM loads, whose logits on step
      1's batch are the PEFT model's within 1e-5 of the largest logit, and whose tensors are
      PEFT's merge_and_unload() of that model (base + s * B @ A in torch) within fp32 rounding:
      4 ulp of the largest term, the weight or s * |B| |A| summed over r (one sgemm against
      torch's matmul, then a multiply and an add); the others bit for bit."""
    import peft
    import transformers
    _, tie, _, _, mts = CASES[label]
    step = os.path.join(case, "ckpt", f"step_{STEPS:08d}")
    manifest = json.load(open(os.path.join(step, "manifest.json")))
    # embed, the blocks, the head; lm_head trained whole (untied) leaves the final norm in a
    # group of its own after them. Trained: the modules' groups (tied: the embedding's).
    L = SIZES["n_layers"]
    n_model = L + 2 + (1 if "lm_head" in mts and not tie else 0)
    whole = ([0] if mts else []) + ([L + 1] if "lm_head" in mts and not tie else [])
    held = sorted({p["group"] for p in manifest["pieces"]})
    states = sorted({p["state"] for p in manifest["pieces"]})
    frozen = manifest.get("frozen", {})
    check(frozen.get("groups") == [g for g in range(n_model) if g not in whole]
          and frozen.get("from") == hf
          and held == whole + list(range(n_model, n_model + L))
          and states == ["exp_avg", "exp_avg_sq", "param"],
          f"{label}: the checkpoint names the model groups but {whole} frozen from the base "
          f"folder and holds the adapter's groups and those, {held} ({', '.join(states)})")
    adapter_dir, merged_dir = os.path.join(case, "export"), os.path.join(case, "merged")
    for args in ([step, "-o", adapter_dir], [step, "-o", merged_dir, "--merge"]):
        res = subprocess.run([num.FT, "export", *args], capture_output=True, text=True)
        if res.returncode != 0:
            check(False, f"{label}: ft export {' '.join(args[1:])} failed ({res.returncode}): "
                         f"{res.stderr.strip()[-2000:]}")
            return
    loaded = peft.PeftModel.from_pretrained(load_base(hf), adapter_dir).eval()
    trained = {n: p.detach() for n, p in model.p.items()}
    got = {n: p.detach() for n, p in loaded.named_parameters()
           if "lora_" in n or "modules_to_save" in n}
    worst = max((float((got[n] - t).abs().max() / t.abs().max()) for n, t in trained.items()
                 if n in got), default=float("inf"))
    check(sorted(got) == sorted(trained) and worst <= 1e-4,
          f"{label}: PEFT loads ft's export onto the base; its {len(got)} A and B"
          f"{' and modules' if mts else ''} are the "
          f"reference's after {STEPS} steps within {worst:.1e} (bound 1e-4)"
          + ("" if sorted(got) == sorted(trained) else
             f" (names differ: {sorted(set(got) ^ set(trained))[:3]})"))
    base = ref.read_safetensors(os.path.join(hf, "model.safetensors"))
    ids, _, _ = num.batch_tensors(ref.samples_no_shuffle(shards, T)[:GLOB])
    merged_model = transformers.AutoModelForCausalLM.from_pretrained(
        merged_dir, attn_implementation="eager").float().eval()
    with torch.no_grad():
        want = loaded(input_ids=ids).logits
        have = merged_model(input_ids=ids).logits
    diff = float((have - want).abs().max() / want.abs().max())
    check(diff <= 1e-5, f"{label}: the --merge folder's logits are the PEFT model's within "
                        f"{diff:.1e} of the largest (bound 1e-5)")
    scale = (ALPHA / math.sqrt(R)) if CASES[label][3] else ALPHA / R
    saved = {n.replace("base_model.model.", "", 1).replace(".modules_to_save.default", "")
             for n in trained if "modules_to_save" in n}  # the modules trained whole
    terms = {}
    for n, m in loaded.named_modules():
        if hasattr(m, "lora_A") and "default" in m.lora_A:
            a, b = m.lora_A["default"].weight.detach(), m.lora_B["default"].weight.detach()
            terms[n.replace("base_model.model.", "", 1) + ".weight"] = float(
                scale * b.abs().max() * a.abs().max() * R)
    state = {n: t.detach() for n, t in loaded.merge_and_unload().state_dict().items()}
    merged = ref.read_safetensors(os.path.join(merged_dir, "model.safetensors"))
    tied = CASES[label][1]
    names_ok = sorted(merged) == sorted(n for n in state if not (tied and n == "lm_head.weight"))
    bad, worst = [], 0.0
    for n, w in merged.items():
        if n in saved:  # trained whole: ft's values, as PEFT's unload takes them from the export
            if not torch.equal(w, state[n]) or torch.equal(w, base[n]):
                bad.append(n)
            continue
        if n not in terms:
            if not torch.equal(w, base[n]):
                bad.append(n)
            continue
        err = float((w - state[n]).abs().max()) / (float(base[n].abs().max()) + terms[n])
        worst = max(worst, err)
        if err > 4 * 2.0**-24:
            bad.append(n)
    check(names_ok and not bad and len(terms) > 0,
          f"{label}: the --merge folder's {len(terms)} adapted weights are PEFT's "
          f"merge_and_unload() within {worst:.1e} of the largest term (bound {4 * 2.0**-24:.1e}), "
          + (f"{sorted(saved)} trained whole as exported, " if saved else "")
          + f"its {len(merged) - len(terms) - len(saved)} other tensors the base's bit for bit"
          + (f" (differ: {bad[:3]})" if bad else "") + ("" if names_ok else " (other names)"))


def main():
    torch.set_num_threads(2)
    only = os.environ.get("FT_LORA_CASES")
    labels = only.split(",") if only else DEFAULT_CASES
    unknown = set(labels) - set(CASES)
    check(not unknown, f"FT_LORA_CASES names known cases (unknown: {sorted(unknown)})")
    import peft
    import transformers
    transformers.utils.logging.disable_progress_bar()  # transformers 5 draws one per load
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"peft {peft.__version__}", flush=True)
    for seed, label in enumerate(CASES, start=1):
        if label not in labels:
            continue
        if not hasattr(transformers, CASES[label][0]):
            check(False, f"{label}: transformers {transformers.__version__} has no "
                         f"{CASES[label][0]} (qwen3: run this in common.sh's hf_torch2_spec venv)")
            continue
        case = os.path.join(TMP, label)
        os.makedirs(case)
        hf, adapter, data, model, shards = reference(label, case, seed)
        losses, norms = reference_steps(label, model, shards)
        if REFERENCE_ONLY:
            for s in range(STEPS):
                print(f"  {label} step {s + 1}: loss {losses[s]:.8f} grad_norm {norms[s]:.7f}")
            continue
        lines = ft_run(label, case, hf, adapter, data)
        if lines is None:
            continue
        compare(label, lines, losses, norms)
        check_ft_base_kept(label, case, hf)
        check_ft_checkpoint_base(label, case, hf, model, shards)
    if num.failures:
        print(f"{len(num.failures)} failed", file=sys.stderr)
        sys.exit(1)
    print("lora_parity: " + ("reference only, all its checks passed" if REFERENCE_ONLY
                             else "all checks passed"))


if __name__ == "__main__":
    main()
