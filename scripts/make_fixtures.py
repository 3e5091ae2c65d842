#!/usr/bin/env python3
"""Build the parity fixtures for graphrun from HF transformers' `qwen4_exp` model.

Usage:
    python scripts/make_fixtures.py --out OUTDIR [--only NAME ...] [--inspect DIR]

Writes one folder per tiny random model under OUTDIR:
    tiny-flat-f32/        flat config, save_pretrained layout, f32
    tiny-composite-bf16/  composite (ConditionalGeneration) layout, 2 shards + index, bf16
    tiny-long-f32/        flat config, state_dict names (fused experts), f32, T=40
    tiny-qwen4exp/        the model shipped in models/ (plus tokenizer.json)
Each folder holds config.json, the weights, expected.safetensors and meta.json.

Everything runs on the CPU in float32 with fixed seeds.  Needs torch, safetensors,
tokenizers and a transformers release that has `transformers.models.qwen4_exp`.
"""

import argparse
import datetime
import importlib
import importlib.util
import inspect
import json
import math
import os
import re
import shutil
import sys

import torch

NEW_TOKENS = 8
TIE_THRESHOLD = 1e-4
MAX_PROMPT_DRAWS = 50

# ----------------------------------------------------------------------------------------------
# transformers access
# ----------------------------------------------------------------------------------------------


def hf():
    import transformers
    from transformers.models.qwen4_exp import configuration_qwen4_exp as cfgmod
    from transformers.models.qwen4_exp import modeling_qwen4_exp as modmod

    return transformers, cfgmod, modmod


def inspect_env(dump_dir):
    """Print (and dump) what the installed transformers says about qwen4_exp."""
    import transformers

    print("transformers", transformers.__version__)
    print("torch", torch.__version__)
    spec = importlib.util.find_spec("transformers.models.qwen4_exp")
    print("transformers.models.qwen4_exp present:", spec is not None)
    if spec is None:
        return
    _, cfgmod, modmod = hf()
    src = inspect.getsource(cfgmod)
    names = sorted(set(re.findall(r'"([a-z_]*(?:attention|indexed)[a-z_]*)"', src)))
    print("layer-type-like strings in configuration source:", names)
    for line in src.splitlines():
        if "layer_types" in line and ("{" in line or "remap" in line or "full_attention" in line):
            print("  cfg:", line.strip())
    tc = cfgmod.Qwen4ExpTextConfig
    print("Qwen4ExpTextConfig.__init__", inspect.signature(tc.__init__))
    if hasattr(tc, "__post_init__"):
        print("Qwen4ExpTextConfig.__post_init__", inspect.signature(tc.__post_init__))
    msrc = inspect.getsource(modmod)
    for i, line in enumerate(msrc.splitlines(), 1):
        if re.search(r"\b(topk|argsort|sort|kthvalue|argmax)\b", line):
            print(f"  modeling:{i}: {line.strip()}")
    from transformers import PreTrainedModel

    print("PreTrainedModel.set_experts_implementation:", hasattr(PreTrainedModel, "set_experts_implementation"))
    if dump_dir:
        os.makedirs(dump_dir, exist_ok=True)
        for mod in ("configuration_qwen4_exp", "modeling_qwen4_exp", "modular_qwen4_exp"):
            try:
                m = importlib.import_module(f"transformers.models.qwen4_exp.{mod}")
                with open(os.path.join(dump_dir, mod + ".py"), "w") as f:
                    f.write(inspect.getsource(m))
            except Exception as exc:  # modular file is not always shipped
                print("no source for", mod, exc)
        for mod in ("conversion_mapping", "cache_utils"):
            try:
                m = importlib.import_module(f"transformers.{mod}")
                with open(os.path.join(dump_dir, mod + ".py"), "w") as f:
                    f.write(inspect.getsource(m))
            except Exception as exc:
                print("no source for", mod, exc)


# ----------------------------------------------------------------------------------------------
# config construction
# ----------------------------------------------------------------------------------------------

# Candidate spellings of the sparse (QSA) attention layer type, tried in this order.
SPARSE_NAMES = ["full_attention", "indexed_attention", "qwen_sparse_attention", "deepseek_sparse_attention"]

# Small sizes shared by the models (the HF test tester's tiny config, spec section 6).
COMMON = dict(
    hidden_act="silu",
    pad_token_id=0,
    bos_token_id=1,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    linear_conv_kernel_dim=2,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_num_key_heads=4,
    linear_num_value_heads=8,
    hc_lowrank=8,
    ple_embed_dim=16,
    ple_conv_kernel_size=2,
    ngram_size=3,
    heads_per_ngram=2,
    ngram_vocab_size_base=31,
    make_ngram_vocab_size_divisible_by=8,
    split_ngram_parts=4,
    indexer_n_heads=2,
    indexer_kv_heads=1,
    indexer_head_dim=8,
    indexer_budget=4,
    indexer_compress_ratio=2,
    moe_intermediate_size=8,
    shared_expert_intermediate_size=8,
    num_experts=4,
    num_experts_per_tok=2,
    tie_word_embeddings=False,
)


def make_text_config(fields, logical_layers):
    """Build a Qwen4ExpTextConfig; `logical_layers` uses 'linear'/'full'.

    Returns (config, requested layer_types list, the spelling used for 'full')."""
    _, cfgmod, _ = hf()
    errors = []
    for sparse in SPARSE_NAMES:
        lt = ["linear_attention" if x == "linear" else sparse for x in logical_layers]
        kw = dict(COMMON)
        kw.update(fields)
        kw["layer_types"] = lt
        kw["num_hidden_layers"] = len(lt)
        try:
            cfg = cfgmod.Qwen4ExpTextConfig(**kw)
        except Exception as exc:  # rejected spelling: try the next one
            errors.append(f"{sparse}: {type(exc).__name__}: {exc}")
            continue
        return cfg, lt, sparse, errors
    raise RuntimeError("no accepted sparse layer-type spelling:\n" + "\n".join(errors))


def set_impls(model):
    """Force eager attention and eager experts; return what the model reports."""
    notes = {}
    try:
        model.set_attn_implementation("eager")
    except Exception as exc:
        notes["set_attn_implementation_error"] = repr(exc)
        model.config._attn_implementation = "eager"
    if hasattr(model, "set_experts_implementation"):
        try:
            model.set_experts_implementation("eager")
        except Exception as exc:
            notes["set_experts_implementation_error"] = repr(exc)
    else:
        notes["experts_implementation"] = "not supported by this transformers version"
    notes["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
    notes["experts_implementation"] = getattr(model.config, "_experts_implementation", notes.get("experts_implementation"))
    return notes


def build_model(cfg, seed):
    _, _, modmod = hf()
    torch.manual_seed(seed)
    try:
        cfg._attn_implementation = "eager"
    except Exception:
        pass
    model = modmod.Qwen4ExpForCausalLM(cfg)
    model = model.float().eval()
    impl = set_impls(model)
    return model, impl


# ----------------------------------------------------------------------------------------------
# weight perturbation
# ----------------------------------------------------------------------------------------------

ZERO_INIT_NORMS = (
    "hc_norm.weight",
    "q_norm.weight",
    "k_norm.weight",
    "q_layernorm.weight",
    "k_layernorm.weight",
    "norm_key.weight",
    "norm_query.weight",
    "norm_conv.weight",
)


@torch.no_grad()
def perturb(model, seed):
    """Move every parameter away from its (degenerate) init, deterministically."""
    g = torch.Generator().manual_seed(seed)

    def randn(shape):
        return torch.randn(shape, generator=g, dtype=torch.float32)

    kinds = {}
    for name, p in model.named_parameters():
        d = p.data
        if name.endswith("linear_attn.norm.weight"):  # GDN gated norm, plain w, init ones
            d.mul_(1.0 + 0.2 * randn(d.shape))
            kind = "gdn_norm*(1+N(0,0.2))"
        elif name.endswith(ZERO_INIT_NORMS) or name.endswith("norm.weight"):  # (1+w) norms, init zero
            d.add_(0.2 * randn(d.shape))
            kind = "norm+N(0,0.2)"
        elif name.endswith("dt_bias"):
            d.add_(0.3 * randn(d.shape))
            kind = "dt_bias+N(0,0.3)"
        elif name.endswith("A_log"):
            kind = "A_log(kept)"
        elif ".ple." in name and name.endswith("conv1d.weight"):
            d.copy_(0.3 * randn(d.shape))
            kind = "ple_conv=N(0,0.3)"
        elif name.endswith("linear_attn.conv1d.weight"):
            d.copy_(randn(d.shape) / math.sqrt(d.shape[-1]))
            kind = "gdn_conv=N(0,1/sqrt(Kc))"
        elif "embed_tokens" in name or "ngram_embedding" in name:
            d.copy_(randn(d.shape))
            kind = "embedding=N(0,1)"
        elif d.ndim >= 2:
            d.copy_(randn(d.shape) / math.sqrt(d.shape[-1]))
            kind = "matrix=N(0,1/sqrt(fan_in))"
        else:
            kind = "UNTOUCHED"
        kinds.setdefault(kind, []).append(name)
    return {k: len(v) for k, v in kinds.items()}, kinds.get("UNTOUCHED", [])


@torch.no_grad()
def round_to_bf16(model):
    for p in model.parameters():
        if p.is_floating_point():
            p.data.copy_(p.data.to(torch.bfloat16).to(torch.float32))


# ----------------------------------------------------------------------------------------------
# top-k tie recorder
# ----------------------------------------------------------------------------------------------


class TopkRecorder:
    """Wraps torch.topk / Tensor.topk and records the boundary gap of every call with k < n."""

    def __init__(self):
        self.sites = {}

    def reset(self):
        self.sites = {}

    @property
    def min_gap(self):
        gaps = [s["min_gap"] for s in self.sites.values()]
        return min(gaps) if gaps else float("inf")

    def _site(self, frame):
        slf = frame.f_locals.get("self")
        owner = type(slf).__name__ if slf is not None else os.path.basename(frame.f_code.co_filename)
        return f"{owner}.{frame.f_code.co_name}"

    @torch.no_grad()
    def observe(self, frame, x, k, dim, largest):
        if not torch.is_tensor(x) or x.ndim == 0 or not x.is_floating_point():
            return
        dim = dim % x.ndim
        n = x.shape[dim]
        site = self._site(frame)
        s = self.sites.setdefault(site, {"calls": 0, "rows": 0, "sparse_rows": 0, "min_gap": float("inf"), "n": set(), "k": set()})
        s["calls"] += 1
        s["n"].add(int(n))
        s["k"].add(int(k))
        if k >= n or k <= 0:
            return
        v = x.detach().to(torch.float64).movedim(dim, -1).reshape(-1, n)
        if not largest:
            v = -v
        finite = torch.isfinite(v)
        vs = torch.sort(torch.where(finite, v, torch.full_like(v, -math.inf)), dim=-1, descending=True).values
        vk, vk1 = vs[:, k - 1], vs[:, k]
        scale = torch.where(finite, v.abs(), torch.zeros_like(v)).amax(-1)
        valid = torch.isfinite(vk)  # rows whose k-th pick is a real candidate
        gap = torch.where(torch.isfinite(vk1), (vk - vk1), torch.full_like(vk, math.inf))
        rel = torch.where(scale > 0, gap / scale.clamp_min(1e-300), torch.zeros_like(gap))
        rel = torch.where(torch.isinf(gap), gap, rel)
        both_zero = (vk == 0) & (vk1 == 0)
        rel = torch.where(both_zero, torch.zeros_like(rel), rel)
        s["rows"] += int(valid.sum())
        s["sparse_rows"] += int((valid & (finite.sum(-1) > k)).sum())
        if valid.any():
            s["min_gap"] = min(s["min_gap"], float(rel[valid].min()))

    def __enter__(self):
        rec = self
        self._orig_fn = torch.topk
        self._orig_meth = torch.Tensor.topk
        orig_fn, orig_meth = self._orig_fn, self._orig_meth

        def parse(args, kwargs):
            k = args[0] if len(args) > 0 else kwargs["k"]
            dim = args[1] if len(args) > 1 else kwargs.get("dim", -1)
            largest = args[2] if len(args) > 2 else kwargs.get("largest", True)
            return int(k), (-1 if dim is None else int(dim)), bool(largest)

        def topk_fn(input, *args, **kwargs):
            out = orig_fn(input, *args, **kwargs)
            k, dim, largest = parse(args, kwargs)
            rec.observe(sys._getframe(1), input, k, dim, largest)
            return out

        def topk_meth(self_, *args, **kwargs):
            out = orig_meth(self_, *args, **kwargs)
            k, dim, largest = parse(args, kwargs)
            rec.observe(sys._getframe(1), self_, k, dim, largest)
            return out

        torch.topk = topk_fn
        torch.Tensor.topk = topk_meth
        return self

    def __exit__(self, *exc):
        torch.topk = self._orig_fn
        torch.Tensor.topk = self._orig_meth
        return False

    def summary(self):
        out = {}
        for site, s in self.sites.items():
            out[site] = {
                "calls": s["calls"],
                "rows_checked": s["rows"],
                "rows_with_more_candidates_than_k": s["sparse_rows"],
                "k_values": sorted(s["k"]),
                "last_dim_sizes": sorted(s["n"]),
                "min_rel_gap": s["min_gap"] if math.isfinite(s["min_gap"]) else None,
            }
        return out


# ----------------------------------------------------------------------------------------------
# running the model
# ----------------------------------------------------------------------------------------------


def first_argmax(row):
    m = row.max()
    return int((row == m).nonzero()[0, 0])


def argmax_gap(row):
    top = torch.sort(row.double(), descending=True).values
    return float((top[0] - top[1]) / top.abs().max())


@torch.no_grad()
def run_prompt(model, prompt, rec):
    """Full forward, greedy cached decode, chunked prefill; all under the top-k recorder."""
    ids = torch.tensor([prompt], dtype=torch.long)
    T = ids.shape[1]
    rec.reset()
    with rec:
        full = model(input_ids=ids, use_cache=False).logits[0].float().clone()
        sites_full = rec.summary()

        out = model(input_ids=ids, use_cache=True)
        pkv = out.past_key_values
        row = out.logits[0, -1].float()
        greedy, greedy_logits, gaps = [], [], []
        for step in range(NEW_TOKENS):
            greedy_logits.append(row.clone())
            gaps.append(argmax_gap(row))
            nxt = first_argmax(row)
            greedy.append(nxt)
            if step == NEW_TOKENS - 1:
                break
            out = model(input_ids=torch.tensor([[nxt]]), past_key_values=pkv, use_cache=True)
            pkv = out.past_key_values
            row = out.logits[0, -1].float()

        half = T // 2
        o1 = model(input_ids=ids[:, :half], use_cache=True)
        o2 = model(input_ids=ids[:, half:], past_key_values=o1.past_key_values, use_cache=True)
        chunked = torch.cat([o1.logits[0], o2.logits[0]], dim=0).float()

        # teacher-forced full forward over prompt + generated: checks the cached decode path
        ext = torch.tensor([prompt + greedy[:-1]], dtype=torch.long)
        ext_logits = model(input_ids=ext, use_cache=False).logits[0].float()
    greedy_logits = torch.stack(greedy_logits)
    res = {
        "logits": full,
        "greedy_ids": torch.tensor(greedy, dtype=torch.long),
        "greedy_logits": greedy_logits,
        "chunked_logits": chunked,
        "chunked_vs_full_max_diff": float((chunked - full).abs().max()),
        "decode_vs_full_max_diff": float((ext_logits[T - 1 :] - greedy_logits).abs().max()),
        "max_abs_logit": float(full.abs().max()),
        "min_topk_rel_gap": rec.min_gap,
        "min_greedy_argmax_rel_gap": min(gaps),
        "topk_sites": rec.summary(),
        "topk_sites_full_forward_only": sites_full,
    }
    return res


def draw_prompt(seed, T, vocab, low, eos_pos, eos_id, forbid=()):
    g = torch.Generator().manual_seed(seed)
    ids = []
    while len(ids) < T:
        t = int(torch.randint(low, vocab, (1,), generator=g))
        if t in forbid:
            continue
        ids.append(t)
    if eos_pos is not None:
        ids[eos_pos] = eos_id
    return ids


@torch.no_grad()
def calibrate_lm_head(model, prompt, lo=1.0, hi=8.0, target=4.0):
    ids = torch.tensor([prompt])
    m = float(model(input_ids=ids, use_cache=False).logits.abs().max())
    if lo <= m <= hi:
        return 1.0
    f = target / m
    model.lm_head.weight.data.mul_(f)
    return f


def find_prompt(model, spec, cfg):
    rec = TopkRecorder()
    tried = []
    for attempt in range(MAX_PROMPT_DRAWS):
        pseed = spec["prompt_seed"] + attempt
        prompt = draw_prompt(pseed, spec["T"], cfg.vocab_size, spec["low"], spec.get("eos_pos"), spec.get("eos_id"), spec.get("forbid", ()))
        res = run_prompt(model, prompt, rec)
        ok = res["min_topk_rel_gap"] >= TIE_THRESHOLD and res["min_greedy_argmax_rel_gap"] >= TIE_THRESHOLD
        tried.append({"prompt_seed": pseed, "min_topk_rel_gap": res["min_topk_rel_gap"], "min_greedy_argmax_rel_gap": res["min_greedy_argmax_rel_gap"]})
        print(f"  [{spec['name']}] prompt seed {pseed}: topk gap {res['min_topk_rel_gap']:.3e}, argmax gap {res['min_greedy_argmax_rel_gap']:.3e} -> {'ok' if ok else 'retry'}")
        if ok:
            return prompt, pseed, res, tried
    raise RuntimeError(f"{spec['name']}: no tie-free prompt in {MAX_PROMPT_DRAWS} draws: {tried}")


# ----------------------------------------------------------------------------------------------
# checkpoint layouts
# ----------------------------------------------------------------------------------------------


def contiguous_clone(sd):
    return {k: v.detach().clone().contiguous() for k, v in sd.items()}


def fuse_state_dict(sd):
    """Runtime names with fused experts and single n-gram tables (normalises older layouts)."""
    out = {}
    per_expert = {}
    shards = {}
    for k, v in sd.items():
        m = re.match(r"(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$", k)
        if m:
            per_expert.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[m.group(3)] = v
            continue
        m = re.match(r"(.*\.ngram_embedding)\.shard_(\d+)\.weight$", k)
        if m:
            shards.setdefault(m.group(1), {})[int(m.group(2))] = v
            continue
        out[k] = v
    for base, experts in per_expert.items():
        idx = sorted(experts)
        out[base + ".gate_up_proj"] = torch.stack([torch.cat([experts[e]["gate_proj"], experts[e]["up_proj"]], 0) for e in idx])
        out[base + ".down_proj"] = torch.stack([experts[e]["down_proj"] for e in idx])
    for base, parts in shards.items():
        out[base + ".weight"] = torch.cat([parts[i] for i in sorted(parts)], 0)
    return out


def split_state_dict(sd, split_parts):
    """Checkpoint names: per-expert experts and `shard_{k}` n-gram pieces (torch.chunk)."""
    out = {}
    for k, v in sd.items():
        if k.endswith(".mlp.experts.gate_up_proj"):
            base = k[: -len("gate_up_proj")]
            inter = v.shape[1] // 2
            for e in range(v.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = v[e, :inter].clone()
                out[f"{base}{e}.up_proj.weight"] = v[e, inter:].clone()
        elif k.endswith(".mlp.experts.down_proj"):
            base = k[: -len("down_proj")]
            for e in range(v.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = v[e].clone()
        elif k.endswith(".ngram_embedding.weight"):
            base = k[: -len("weight")]
            for i, part in enumerate(torch.chunk(v, split_parts, dim=0)):
                out[f"{base}shard_{i}.weight"] = part.clone()
        else:
            out[k] = v
    return out


def key_table(path_or_paths):
    from safetensors import safe_open

    paths = path_or_paths if isinstance(path_or_paths, list) else [path_or_paths]
    table = {}
    for p in paths:
        with safe_open(p, framework="pt") as f:
            for k in f.keys():
                t = f.get_slice(k)
                table[k] = {"shape": list(t.get_shape()), "dtype": t.get_dtype(), "file": os.path.basename(p)}
    return dict(sorted(table.items()))


def key_patterns(keys):
    pats = set()
    for k in keys:
        k = re.sub(r"\.layers\.\d+\.", ".layers.{i}.", k)
        k = re.sub(r"\.experts\.\d+\.", ".experts.{e}.", k)
        pats.add(re.sub(r"shard_\d+", "shard_{k}", k))
    return sorted(pats)


def json_safe(x):
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set)):
        return [json_safe(v) for v in x]
    return x


def dir_size(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if os.path.isfile(os.path.join(d, f)))


@torch.no_grad()
def reload_check(folder, prompt, expected_logits, cls_name="Qwen4ExpForCausalLM"):
    """Load the written folder back with transformers and compare the logits."""
    _, _, modmod = hf()
    cls = getattr(modmod, cls_name)
    kw = dict(dtype=torch.float32, attn_implementation="eager")
    try:
        model, info = cls.from_pretrained(folder, experts_implementation="eager", output_loading_info=True, **kw)
    except TypeError:
        model, info = cls.from_pretrained(folder, output_loading_info=True, **kw)
    model = model.float().eval()
    set_impls(model)
    logits = model(input_ids=torch.tensor([prompt]), use_cache=False).logits[0].float()
    diff = float((logits - expected_logits).abs().max())
    clean_info = {k: sorted(str(x) for x in v) if isinstance(v, (set, list, tuple)) else str(v) for k, v in info.items() if v}
    return {"class": cls_name, "max_abs_diff_vs_expected": diff, "loading_info": clean_info}


def save_expected(folder, prompt, res):
    from safetensors.torch import save_file

    tensors = {
        "prompt_ids": torch.tensor(prompt, dtype=torch.long),
        "logits": res["logits"].contiguous(),
        "greedy_ids": res["greedy_ids"].contiguous(),
        "chunked_logits": res["chunked_logits"].contiguous(),
        "greedy_logits": res["greedy_logits"].contiguous(),
    }
    save_file(tensors, os.path.join(folder, "expected.safetensors"), metadata={"format": "pt"})


def base_meta(spec, cfg, lt_requested, sparse_used, rejected, impl, seed, init_counts, untouched, lm_scale, prompt, pseed, res, tried):
    import transformers

    return {
        "name": spec["name"],
        "description": spec["description"],
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": "cpu",
        "compute_dtype": "float32",
        "attn_implementation": impl.get("attn_implementation"),
        "experts_implementation": impl.get("experts_implementation"),
        "impl_notes": {k: v for k, v in impl.items() if k.endswith("error")},
        "weight_seed": seed,
        "prompt_seed": pseed,
        "prompt_draws": tried,
        "prompt_ids": prompt,
        "T": len(prompt),
        "new_tokens": NEW_TOKENS,
        "greedy_ids": res["greedy_ids"].tolist(),
        "max_abs_logit": res["max_abs_logit"],
        "min_topk_rel_gap": res["min_topk_rel_gap"],
        "min_greedy_argmax_rel_gap": res["min_greedy_argmax_rel_gap"],
        "tie_threshold": TIE_THRESHOLD,
        "chunked_vs_full_max_diff": res["chunked_vs_full_max_diff"],
        "chunk_split": len(prompt) // 2,
        "decode_vs_full_max_diff": res["decode_vs_full_max_diff"],
        "topk_sites": res["topk_sites"],
        "topk_sites_full_forward_only": res["topk_sites_full_forward_only"],
        "layer_types_requested": lt_requested,
        "layer_types_in_hf_config": list(cfg.layer_types),
        "sparse_layer_type_spelling_used": sparse_used,
        "sparse_layer_type_spellings_rejected": rejected,
        "rope_parameters_in_hf_config": dict(cfg.rope_parameters) if cfg.rope_parameters else None,
        "init": {
            "counts": init_counts,
            "untouched_params": untouched,
            "lm_head_scale": lm_scale,
            "rule": "(1+w) norms += N(0,0.2); GDN norm *= 1+N(0,0.2); dt_bias += N(0,0.3); PLE conv1d = N(0,0.3); "
            "GDN conv1d = N(0,1/sqrt(Kc)); embeddings (tokens, ngram) = N(0,1); other matrices N(0,1/sqrt(fan_in)); "
            "A_log kept; lm_head rescaled so max|logit| is in [1,8] on the first probe prompt",
        },
        "expected_tensors": {
            "prompt_ids": "i64 [T]",
            "logits": "f32 [T, vocab], one forward, no cache",
            "greedy_ids": f"i64 [{NEW_TOKENS}], greedy with the HF cache, no eos stop, lowest index on ties",
            "greedy_logits": f"f32 [{NEW_TOKENS}, vocab]; row i = the logits that produced greedy_ids[i] (row 0 = last prefill row)",
            "chunked_logits": "f32 [T, vocab], prefill in two chunks (split at T//2) with the HF cache, concatenated",
        },
    }


def check_sparse(spec, cfg, res):
    T = spec["T"]
    budget, cr = cfg.indexer_budget, cfg.indexer_compress_ratio
    assert T >= budget + cr, f"T={T} too short for budget {budget} + cr {cr}"
    assert T // cr > budget // cr, "no query row with more complete blocks than budget/cr"
    idx_sites = {k: v for k, v in res["topk_sites_full_forward_only"].items() if "ndex" in k or "ttention" in k}
    sparse_rows = sum(v["rows_with_more_candidates_than_k"] for v in idx_sites.values())
    return {
        "budget": budget,
        "compress_ratio": cr,
        "complete_blocks_last_row": T // cr,
        "block_topk": budget // cr,
        "indexer_topk_sites": sorted(idx_sites),
        "indexer_rows_with_more_blocks_than_topk_full_forward": sparse_rows,
    }


# ----------------------------------------------------------------------------------------------
# tokenizer for models/tiny-qwen4exp
# ----------------------------------------------------------------------------------------------

WORDS = """
the of and to a in is it you that he was for on are with as i his they be at one have this from or had by
not word but what some we can out other were all there when up use your how said an each she which do their
time if will way about many then them write would like so these her long make thing see him two has look more
day could go come did number sound no most people my over know water than call first who may down side been
now find any new work part take get place made live where after back little only round man year came show
every good me give our under name very through just form sentence great think say help low line differ turn
cause much mean before move right boy old too same tell does set three want air well also play small end put
home read hand port large spell add even land here must big high such follow act why ask men change went light
kind off need house picture try us again animal point mother world near build self earth father head stand own
page should country found answer school grow study still learn plant cover food sun four between state keep eye
never last let thought city tree cross farm hard start might story saw far sea draw left late run while press
close night real life few north open seem together next white children begin got walk example ease paper group
always music those both mark often letter until mile river car feet care second book carry took science eat room
friend began idea fish mountain stop once base hear horse cut sure watch color face wood main enough plain girl
usual young ready above ever red list though feel talk bird soon body dog family direct pose leave song measure
door product black short numeral class wind question happen complete ship area half rock order fire south problem
piece told knew pass since top whole king space heard best hour better true during hundred five remember step
early hold west ground interest reach fast verb sing listen six table travel less morning ten simple several
vowel toward war lay against pattern slow center love person money serve appear road map rain rule govern pull
cold notice voice unit power town fine certain fly fall lead cry dark machine note wait plan figure star box
noun field rest correct able pound done beauty drive stood contain front teach week final gave green oh quick
develop ocean warm free minute strong special mind behind clear tail produce fact street inch multiply nothing
course stay wheel full force blue object decide surface deep moon island foot system busy test record boat common
gold possible plane stead dry wonder laugh thousand ago ran check game shape equate hot miss brought heat snow
tire bring yes distant fill east paint language among cat sat mat
"""


def build_tokenizer(path, vocab_size):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    specials = ["[PAD]", "[BOS]", "[EOS]", "[UNK]"]
    punct = [".", ",", "?", "!"]
    n_words = vocab_size - len(specials) - len(punct)
    must = ["the", "cat", "sat", "on", "mat"]
    words = []
    for w in must + WORDS.split():
        if w not in words:
            words.append(w)
    assert len(words) >= n_words, (len(words), n_words)
    words = words[:n_words]
    tokens = specials + words + punct
    assert len(tokens) == vocab_size and len(set(tokens)) == vocab_size
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tok.add_special_tokens([AddedToken(t, special=True) for t in specials])
    tok.save(path)

    back = Tokenizer.from_file(path)
    text = "the cat sat on the mat ."
    ids = back.encode(text).ids
    assert vocab["[UNK]"] not in ids, ids
    assert back.decode(ids) == text, (ids, back.decode(ids))
    assert back.encode("[EOS]").ids == [2]
    return back, {"roundtrip_text": text, "roundtrip_ids": ids, "decoded": back.decode(ids)}


# ----------------------------------------------------------------------------------------------
# the four models
# ----------------------------------------------------------------------------------------------

MODELS = {
    "tiny-flat-f32": dict(
        description="flat qwen4_exp_text config, save_pretrained layout (model.* prefix), f32; 3 layers "
        "(GDN, GDN+PLE, QSA), hc 2, sigmoid output gate, PLE on layer id 2, prompt with eos at position 6",
        seed=1001,
        prompt_seed=11000,
        logical_layers=["linear", "linear", "full"],
        fields=dict(
            vocab_size=128, hidden_size=32, num_attention_heads=2, num_key_value_heads=2, head_dim=16,
            eos_token_id=2, rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.25},
            ple_layer_ids=[2], hc_count=2, hc_lowrank=8, output_gate_type="sigmoid",
        ),
        T=16, low=3, eos_pos=6, eos_id=2, layout="save_pretrained",
    ),
    "tiny-composite-bf16": dict(
        description="composite qwen4_exp config (text_config + vision_config), model.language_model.* prefix, fused "
        "experts, single n-gram tables, two safetensors shards + index, bf16 weights (expected outputs computed in f32 "
        "from the bf16-rounded weights); 4 layers (GDN+PLE, QSA, GDN+PLE, QSA), hc 4, silu output gate, "
        "eos list [3,5], top-level partial_rotary_factor 0.5",
        seed=2002,
        prompt_seed=22000,
        logical_layers=["linear", "full", "linear", "full"],
        fields=dict(
            vocab_size=160, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            eos_token_id=[3, 5],
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
            ple_layer_ids=[1, 3], hc_count=4, hc_lowrank=8, output_gate_type="silu",
            linear_conv_kernel_dim=4, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=16, linear_value_head_dim=8, ple_conv_kernel_size=4,
            num_experts=8, num_experts_per_tok=3, moe_intermediate_size=8, shared_expert_intermediate_size=16,
            indexer_n_heads=2, indexer_head_dim=8, indexer_budget=4, indexer_compress_ratio=2,
        ),
        T=20, low=6, eos_pos=9, eos_id=3, forbid=(3, 5), layout="composite",
    ),
    "tiny-long-f32": dict(
        description="flat qwen4_exp_text config, state_dict names (model.*, fused experts) in one model.safetensors, "
        "f32; 4 layers (GDN, QSA, GDN, QSA), no PLE, hc 4, sigmoid gate, indexer budget 8 / compress ratio 4, T=40",
        seed=3003,
        prompt_seed=33000,
        logical_layers=["linear", "full", "linear", "full"],
        fields=dict(
            vocab_size=96, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            eos_token_id=2, rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.5},
            ple_layer_ids=[], hc_count=4, hc_lowrank=8, output_gate_type="sigmoid",
            linear_conv_kernel_dim=4, indexer_budget=8, indexer_compress_ratio=4,
        ),
        T=40, low=3, eos_pos=None, eos_id=None, layout="state_dict",
    ),
    "tiny-qwen4exp": dict(
        description="the repo's demo model (models/tiny-qwen4exp): flat config, save_pretrained layout, f32; 4 layers "
        "(GDN, GDN+PLE, QSA, GDN), vocab 256, hidden 64, hc 4, sigmoid gate; WordLevel tokenizer.json",
        seed=4004,
        prompt_seed=44000,
        logical_layers=["linear", "linear", "full", "linear"],
        fields=dict(
            vocab_size=256, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            eos_token_id=2, rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.25},
            ple_layer_ids=[2], hc_count=4, hc_lowrank=8, output_gate_type="sigmoid",
            linear_conv_kernel_dim=4, ple_embed_dim=32, ple_conv_kernel_size=4, split_ngram_parts=3,
            moe_intermediate_size=16, shared_expert_intermediate_size=16,
        ),
        T=16, low=4, eos_pos=6, eos_id=2, layout="save_pretrained", tokenizer=True,
    ),
}


def write_save_pretrained(model, cfg, folder, notes):
    from safetensors.torch import save_file

    model.save_pretrained(folder)
    files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    table = key_table([os.path.join(folder, f) for f in files])
    keys = list(table)
    per_expert = any(re.search(r"\.experts\.\d+\.", k) for k in keys)
    sharded = any(".shard_" in k for k in keys)
    notes["save_pretrained_files"] = files
    notes["save_pretrained_per_expert_experts"] = per_expert
    notes["save_pretrained_sharded_ngram"] = sharded
    notes["save_pretrained_key_patterns"] = key_patterns(keys)
    want_shards = bool(cfg.ple_layer_ids)
    if len(files) != 1 or not per_expert or (want_shards and not sharded):
        # the installed version did not write the checkpoint layout; write it ourselves
        sd = split_state_dict(fuse_state_dict(contiguous_clone(model.state_dict())), cfg.split_ngram_parts)
        for f in files:
            os.remove(os.path.join(folder, f))
        idx = os.path.join(folder, "model.safetensors.index.json")
        if os.path.exists(idx):
            os.remove(idx)
        save_file(contiguous_clone(sd), os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
        notes["rewritten_by_script"] = "save_pretrained output lacked per-expert/shard layout or was not one file; rewrote model.safetensors"
    return key_table(os.path.join(folder, "model.safetensors"))


def write_state_dict(model, cfg, folder, notes):
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    cfg.architectures = ["Qwen4ExpForCausalLM"]
    cfg.to_json_file(os.path.join(folder, "config.json"), use_diff=False)
    sd = fuse_state_dict(contiguous_clone(model.state_dict()))
    save_file(sd, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    notes["config_json"] = "full config (to_json_file use_diff=False)"
    return key_table(os.path.join(folder, "model.safetensors"))


def write_composite(model, cfg, folder, notes, seed):
    from safetensors.torch import save_file

    _, cfgmod, _ = hf()
    os.makedirs(folder, exist_ok=True)
    text = cfg.to_dict()
    for k in [k for k in text if k.startswith("_")]:
        text.pop(k)
    text.pop("architectures", None)
    text["model_type"] = "qwen4_exp_text"
    text["dtype"] = "bfloat16"
    # mirror the real checkpoint: "full_attention" in layer_types, partial_rotary_factor at the top level
    text["layer_types"] = ["linear_attention" if t == "linear_attention" else "full_attention" for t in cfg.layer_types]
    rope = dict(text.get("rope_parameters") or {})
    prf = rope.pop("partial_rotary_factor", None)
    text["rope_parameters"] = rope
    text["partial_rotary_factor"] = prf
    vision = dict(
        depth=1, hidden_size=16, intermediate_size=32, num_heads=2, in_channels=3, patch_size=2,
        temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=cfg.hidden_size, num_position_embeddings=16,
    )
    vcfg = cfgmod.Qwen4ExpVisionConfig(**vision).to_dict()
    for k in [k for k in vcfg if k.startswith("_")]:
        vcfg.pop(k)
    import transformers

    comp = {
        "model_type": "qwen4_exp",
        "architectures": ["Qwen4ExpForConditionalGeneration"],
        "text_config": text,
        "vision_config": vcfg,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
        "transformers_version": transformers.__version__,
    }

    def dump(c):
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(c, f, indent=2, sort_keys=True)

    dump(comp)
    try:
        cfgmod.Qwen4ExpConfig.from_pretrained(folder)
    except Exception as exc:  # "full_attention" not accepted: write the spelling the model was built with
        notes["full_attention_rejected"] = f"{type(exc).__name__}: {exc}"[:500]
        text["layer_types"] = list(cfg.layer_types)
        dump(comp)
    # does HF read this config the way we computed? (layer types remap, top-level partial_rotary_factor)
    loaded = cfgmod.Qwen4ExpConfig.from_pretrained(folder)
    lrope = dict(loaded.text_config.rope_parameters or {})
    notes["hf_reads_layer_types"] = list(loaded.text_config.layer_types)
    notes["hf_reads_rope_parameters"] = lrope
    notes["hf_reads_eos_token_id"] = loaded.text_config.eos_token_id
    if lrope.get("partial_rotary_factor") != prf:
        text["rope_parameters"]["partial_rotary_factor"] = prf
        text.pop("partial_rotary_factor")
        dump(comp)
        loaded = cfgmod.Qwen4ExpConfig.from_pretrained(folder)
        notes["partial_rotary_factor"] = "top-level field NOT folded by HF; moved into rope_parameters"
        notes["hf_reads_rope_parameters_after_fix"] = dict(loaded.text_config.rope_parameters or {})
    else:
        notes["partial_rotary_factor"] = "top-level field folded into rope_parameters by HF"
    if list(loaded.text_config.layer_types) != list(cfg.layer_types):
        text["layer_types"] = list(cfg.layer_types)
        dump(comp)
        notes["layer_types_full_attention"] = "not remapped by HF; wrote the accepted spelling instead"
    else:
        notes["layer_types_full_attention"] = "config.json says full_attention; HF remaps it to " + repr(sorted(set(cfg.layer_types) - {"linear_attention"}))

    sd = fuse_state_dict(contiguous_clone(model.state_dict()))
    g = torch.Generator().manual_seed(seed + 77)
    ck = {}
    for k, v in sd.items():
        nk = "model.language_model." + k[len("model."):] if k.startswith("model.") else k
        ck[nk] = v.to(torch.bfloat16) if v.is_floating_point() else v
    H = cfg.hidden_size
    ck["mtp.fc_hidden.weight"] = (torch.randn(H, H, generator=g) / math.sqrt(H)).to(torch.bfloat16)
    ck["model.visual.patch_embed.proj.weight"] = (torch.randn(16, 3, 2, 2, 2, generator=g) * 0.1).to(torch.bfloat16)
    names = sorted(ck)
    first = [k for k in names if k.startswith("model.language_model.embed_tokens") or re.match(r"model\.language_model\.layers\.[01]\.", k)]
    files = {"model-00001-of-00002.safetensors": {k: ck[k] for k in first},
             "model-00002-of-00002.safetensors": {k: ck[k] for k in names if k not in first}}
    weight_map = {}
    total = 0
    for fname, part in files.items():
        save_file({k: v.contiguous() for k, v in part.items()}, os.path.join(folder, fname), metadata={"format": "pt"})
        for k, v in part.items():
            weight_map[k] = fname
            total += v.numel() * v.element_size()
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
    return key_table([os.path.join(folder, f) for f in files])


def build_one(name, out_dir):
    spec = dict(MODELS[name])
    spec["name"] = name
    print(f"== {name}")
    cfg, lt, sparse_used, rejected = make_text_config(spec["fields"], spec["logical_layers"])
    print(f"  layer types requested {lt} -> HF config {cfg.layer_types}; rope {cfg.rope_parameters}")
    model, impl = build_model(cfg, spec["seed"])
    # every sparse layer must really carry a QSA indexer
    for i, layer in enumerate(model.model.layers):
        if cfg.layer_types[i] != "linear_attention":
            assert hasattr(layer, "self_attn") and hasattr(layer.self_attn, "indexer"), f"layer {i} has no indexer"
    init_counts, untouched = perturb(model, spec["seed"] + 1)
    probe = draw_prompt(spec["prompt_seed"], spec["T"], cfg.vocab_size, spec["low"], spec.get("eos_pos"), spec.get("eos_id"), spec.get("forbid", ()))
    lm_scale = calibrate_lm_head(model, probe)
    if spec["layout"] == "composite":
        round_to_bf16(model)
    prompt, pseed, res, tried = find_prompt(model, spec, cfg)
    sparse = check_sparse(spec, cfg, res)
    print(f"  max|logit| {res['max_abs_logit']:.4f}  gap {res['min_topk_rel_gap']:.3e}  chunked diff {res['chunked_vs_full_max_diff']:.3e}  decode diff {res['decode_vs_full_max_diff']:.3e}")

    folder = os.path.join(out_dir, name)
    if os.path.exists(folder):
        shutil.rmtree(folder)
    os.makedirs(folder)
    notes = {}
    if spec["layout"] == "save_pretrained":
        table = write_save_pretrained(model, cfg, folder, notes)
    elif spec["layout"] == "state_dict":
        table = write_state_dict(model, cfg, folder, notes)
    else:
        table = write_composite(model, cfg, folder, notes, spec["seed"])
    save_expected(folder, prompt, res)

    meta = base_meta(spec, cfg, lt, sparse_used, rejected, impl, spec["seed"], init_counts, untouched, lm_scale, prompt, pseed, res, tried)
    meta["layout"] = spec["layout"]
    meta["layout_notes"] = notes
    meta["sparse_check"] = sparse
    meta["tensor_key_patterns"] = key_patterns(table)
    meta["tensors"] = table

    if spec.get("tokenizer"):
        tok, tinfo = build_tokenizer(os.path.join(folder, "tokenizer.json"), cfg.vocab_size)
        tinfo["prompt_text"] = tok.decode(prompt, skip_special_tokens=False)
        tinfo["greedy_text"] = tok.decode(res["greedy_ids"].tolist(), skip_special_tokens=False)
        meta["tokenizer"] = tinfo

    checks = []
    classes = ["Qwen4ExpForCausalLM"] + (["Qwen4ExpForConditionalGeneration"] if spec["layout"] == "composite" else [])
    for cls_name in classes:
        try:
            checks.append(reload_check(folder, prompt, res["logits"], cls_name))
        except Exception as exc:
            checks.append({"class": cls_name, "error": f"{type(exc).__name__}: {exc}"[:2000]})
    meta["hf_reload_checks"] = checks
    for c in checks:
        print(f"  reload {c}")
    meta["folder_bytes"] = dir_size(folder)
    with open(os.path.join(folder, "meta.json"), "w") as f:
        json.dump(json_safe(meta), f, indent=2, allow_nan=False)
    print(f"  wrote {folder} ({meta['folder_bytes']} bytes)")
    return meta


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory; one sub-folder per model")
    ap.add_argument("--only", nargs="*", default=None, help="subset of: " + ", ".join(MODELS))
    ap.add_argument("--inspect", default=None, help="print the transformers environment and dump qwen4_exp sources here")
    args = ap.parse_args()

    torch.set_grad_enabled(False)
    if args.inspect is not None:
        inspect_env(args.inspect)
    os.makedirs(args.out, exist_ok=True)
    names = args.only or list(MODELS)
    failures = {}
    for name in names:
        try:
            build_one(name, args.out)
        except Exception as exc:
            import traceback

            traceback.print_exc()
            failures[name] = f"{type(exc).__name__}: {exc}"
    if failures:
        print("FAILED:", json.dumps(failures, indent=2))
        sys.exit(1)
    print("all fixtures written to", args.out)


if __name__ == "__main__":
    main()
