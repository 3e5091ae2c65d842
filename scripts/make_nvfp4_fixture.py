#!/usr/bin/env python3
"""Expected outputs for the NVFP4 parity fixture (tests/fixtures/tiny-nvfp4), from transformers.

Usage:
    CUDA_VISIBLE_DEVICES= python3 scripts/make_nvfp4_fixture.py --model tests/fixtures/tiny-nvfp4
    python3 scripts/make_nvfp4_fixture.py --self-check [--model DIR]     # no torch needed

The fixture's checkpoint is written by `graphrun synth --experts nvfp4` (ModelOpt layout: per
expert U8 E2M1 codes `weight`, F8_E4M3 `weight_scale` per 16 inputs, f32 `weight_scale_2`, f32
`input_scale`; an f32 trunk), see SYNTH_COMMAND.  This script reads it with `safetensors`,
dequantises every expert matrix exactly as docs/spec (moe-nvfp4-loader B.3/B.4) define it, in
float32:

    w[r][c] = (e2m1(code) * e4m3(scale)) * weight_scale_2      (f32, left to right)

with element 2i of a row in the low nibble of byte i, E2M1 bit 3 the sign, E4M3 bit 7 the sign,
bits 6..3 the exponent (bias 7), bits 2..0 the mantissa, subnormals m/8 * 2^-6, and the ModelOpt
NaN codes 0x7F / 0xFF read as +0.0.  The scale bytes are decoded here from their raw bits (not
by torch's float8_e4m3fn, which reads 0x7F/0xFF as NaN).  The dequantised experts are fused the
way transformers' qwen4_exp holds them (`mlp.experts.gate_up_proj [E, 2I, H]`, gate rows first,
`mlp.experts.down_proj [E, H, I]`), every other tensor is loaded as stored (f32), a float32
Qwen4ExpForCausalLM is built fresh (eager attention and experts) and run on the CPU on a prompt
drawn with make_fixtures.py's tie-gap policy.  Writes, into the fixture folder:

    expected.safetensors   prompt_ids, logits, greedy_ids, greedy_logits, chunked_logits
                           (make_fixtures.save_expected: the format of the other fixtures)
    meta.json              versions, date, seeds, prompt ids, gaps, how the experts were
                           dequantised, the checks below

and prints a summary for results/fixtures.log.  Checks made on the way (any failure stops
the script before anything is written): the F8_E4M3 bytes torch hands back equal the file's raw
bytes; the vectorised torch dequantisation equals an element-by-element pure-python one bit for
bit on every matrix; the state dict built matches the model's key for key (names, shapes,
dtypes); the int64 PLE buffers of the checkpoint equal the ones transformers computes.

Needs torch, safetensors and a transformers release with `transformers.models.qwen4_exp` (the
fixture was planned for torch 2.11, transformers 5.17).  `--self-check` needs neither: it checks
the decoding against the spec's tables and worked example, and, if the fixture is there, reads
and dequantises it in pure python.
"""

import argparse
import datetime
import hashlib
import json
import math
import os
import platform
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DEFAULT_MODEL = os.path.join(REPO, "tests", "fixtures", "tiny-nvfp4")

# How the committed checkpoint was made (recorded in meta.json).
SYNTH_SEED = 5005
SYNTH_COMMAND = (
    "graphrun synth --config CONFIG --out tests/fixtures/tiny-nvfp4 --dtype f32 "
    f"--seed {SYNTH_SEED} --experts nvfp4"
)

# The prompt, drawn as make_fixtures.py draws the demo model's (eos at position 6).
PROMPT = dict(name="tiny-nvfp4", prompt_seed=55000, T=16, low=4, eos_pos=6)

GROUP = 16

# ----------------------------------------------------------------------------------------------
# NVFP4 decoding, pure python (the spec, B.2-B.4)
# ----------------------------------------------------------------------------------------------

E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def e2m1(code):
    """E2M1 code (4 bits) -> value; bit 3 is the sign (code 8 is -0.0)."""
    mag = E2M1_MAGNITUDES[code & 7]
    return -mag if code & 8 else mag


def e4m3(byte):
    """E4M3 byte -> value, ModelOpt convention: 0x7F and 0xFF (NaN codes) are +0.0."""
    mag = byte & 0x7F
    if mag == 0x7F:
        return 0.0
    e, m = (mag >> 3) & 0xF, mag & 7
    v = (m / 8.0) * 2.0**-6 if e == 0 else (1.0 + m / 8.0) * 2.0 ** (e - 7)
    return -v if byte & 0x80 else v


def f32(x):
    """x rounded to the nearest float32 (a product of two f32 computed in double and rounded
    once to f32 is the correctly rounded f32 product: 53 >= 2*24 + 2)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def dequant_py(codes, scales, macro, rows, cols):
    """Row-major list of the rows x cols weights (codes: rows*cols/2 bytes, scales:
    rows*cols/16 bytes, macro: the f32 global scale as a python float)."""
    out = []
    groups = cols // GROUP
    for r in range(rows):
        for c in range(cols):
            byte = codes[r * cols // 2 + c // 2]
            code = byte & 0x0F if c % 2 == 0 else byte >> 4
            s = scales[r * groups + c // GROUP]
            out.append(f32(f32(e2m1(code) * e4m3(s)) * macro))
    return out


# ----------------------------------------------------------------------------------------------
# safetensors, pure python (raw bytes; for the self-check and to cross-check what torch reads)
# ----------------------------------------------------------------------------------------------


def checkpoint_files(folder):
    idx = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            return sorted(set(json.load(f)["weight_map"].values()))
    return ["model.safetensors"]


def read_raw(folder):
    """{name: (dtype, shape, bytes)} over the checkpoint's files."""
    out = {}
    for fname in checkpoint_files(folder):
        with open(os.path.join(folder, fname), "rb") as f:
            blob = f.read()
        (n,) = struct.unpack("<Q", blob[:8])
        header = json.loads(blob[8 : 8 + n])
        base = 8 + n
        for name, info in header.items():
            if name == "__metadata__":
                continue
            a, b = info["data_offsets"]
            out[name] = (info["dtype"], list(info["shape"]), blob[base + a : base + b])
    return out


def nvfp4_stems(names):
    """The stems `...experts.{e}.{kind}` that have U8 codes, sorted."""
    return sorted(n[: -len(".weight")] for n in names if n.endswith(".weight") and ".experts." in n)


def pure_python_dequant(folder):
    """Every NVFP4 matrix of the checkpoint dequantised in pure python:
    ({stem: (rows, cols, list of f32 values)}, number of NaN scale bytes)."""
    raw = read_raw(folder)
    mats, nan_bytes = {}, 0
    for stem in nvfp4_stems(raw):
        dt, shape, codes = raw[stem + ".weight"]
        assert dt == "U8", f"{stem}.weight: {dt}, expected U8"
        sdt, sshape, scales = raw[stem + ".weight_scale"]
        assert sdt == "F8_E4M3", f"{stem}.weight_scale: {sdt}, expected F8_E4M3"
        gdt, gshape, gbytes = raw[stem + ".weight_scale_2"]
        assert gdt == "F32" and len(gbytes) == 4, f"{stem}.weight_scale_2: {gdt} {gshape}"
        rows, cols = shape[0], shape[1] * 2
        assert sshape == [rows, cols // GROUP], f"{stem}.weight_scale: shape {sshape}"
        (macro,) = struct.unpack("<f", gbytes)
        nan_bytes += sum(1 for b in scales if b & 0x7F == 0x7F)
        mats[stem] = (rows, cols, dequant_py(codes, scales, macro, rows, cols))
    return mats, nan_bytes


def digest(mats):
    """sha256 of the dequantised matrices' f32 bytes (little endian), stems in sorted order."""
    h = hashlib.sha256()
    for stem in sorted(mats):
        rows, cols, vals = mats[stem]
        h.update(struct.pack(f"<{len(vals)}f", *vals))
    return h.hexdigest()


# ----------------------------------------------------------------------------------------------
# --self-check
# ----------------------------------------------------------------------------------------------


def self_check(model_dir):
    failures = []

    def check(ok, what):
        print(("  ok   " if ok else "  FAIL ") + what)
        if not ok:
            failures.append(what)

    def same(a, b):  # equal as f32 bit patterns (tells -0.0 from +0.0)
        return f32_bits(a) == f32_bits(b)

    print("self-check: NVFP4 decoding against docs/spec moe-nvfp4-loader B.2-B.4")
    # B.2: the E2M1 table, sign bit 3.
    table = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
    check(all(same(e2m1(c), v) for c, v in enumerate(table)), "E2M1 codes 0..15 as B.2 (code 8 is -0.0)")
    # B.3: the examples table.
    examples = {
        0x00: 0.0, 0x01: 2.0**-9, 0x08: 2.0**-6, 0x30: 0.5, 0x38: 1.0, 0x3C: 1.5, 0x3F: 1.875,
        0x40: 2.0, 0x7E: 448.0, 0x80: -0.0, 0xB8: -1.0, 0x7F: 0.0, 0xFF: 0.0,
    }
    for b, v in examples.items():
        check(same(e4m3(b), v), f"E4M3 0x{b:02X} -> {e4m3(b)!r} (spec {v!r})")
    check(math.copysign(1.0, e4m3(0xFF)) == 1.0, "E4M3 0xFF is +0.0 (the sign is not applied to NaN codes)")
    # Every other byte against an independent decoding: the same bits rebuilt as an IEEE half
    # (normals: exponent field e - 7 + 15, mantissa shifted to the top of the half's 10 bits),
    # subnormals as m * 2^-9.
    bad = []
    for b in range(256):
        mag, sign = b & 0x7F, b >> 7
        if mag == 0x7F:
            continue
        e, m = mag >> 3, mag & 7
        if e == 0:
            want = math.ldexp(m, -9)
            want = -want if sign else want
        else:
            half = (sign << 15) | ((e + 8) << 10) | (m << 7)
            (want,) = struct.unpack("<e", struct.pack("<H", half))
        if not same(e4m3(b), want):
            bad.append(b)
    check(not bad, f"E4M3: all 254 non-NaN bytes equal the IEEE-half rebuild of their bits {bad[:8]}")
    # B.4: E2M1 x E4M3 is exact in f32, so only the global multiply rounds.
    exact = all(f32(e2m1(c) * e4m3(b)) == e2m1(c) * e4m3(b) for c in range(16) for b in range(256))
    check(exact, "E2M1 x E4M3 is exact in f32 for all 16 x 256 pairs")
    # B.4 worked example: codes[0] = 0x7A (element 0 = low nibble 0xA = -1.0, element 1 = 0x7 = 6),
    # macro 5.9945243e-5; one row of 16 columns (8 code bytes, 1 scale byte).
    macro = f32(5.9945243e-5)
    codes = bytes([0x7A] + [0] * 7)
    w = dequant_py(codes, bytes([0x38]), macro, 1, 16)
    check(same(w[0], -macro) and f"{w[0]:.7e}" == "-5.9945243e-05", f"worked example w[0][0] = {w[0]:.7e} (spec -5.9945243e-5)")
    check(same(w[1], f32(6.0 * macro)), f"worked example w[0][1] = 6 * macro = {w[1]:.7e}")
    w = dequant_py(codes, bytes([0x3C]), macro, 1, 16)
    check(f"{w[1]:.7e}" == "5.3950719e-04" and same(w[1], f32(9.0 * macro)), f"worked example, scale 0x3C: w[0][1] = {w[1]:.7e} (spec 5.3950719e-4)")
    check(same(w[0], f32(-1.5 * macro)), f"worked example, scale 0x3C: w[0][0] = {w[0]:.7e} (-1.5 * macro)")
    # Nibble order and groups along the row: element 2i low nibble, a new scale every 16 columns.
    codes = bytes([0x21] * 16)  # every even column code 1 (0.5), odd column code 2 (1.0)
    w = dequant_py(codes, bytes([0x38, 0x40]), 1.0, 1, 32)
    check(w[:4] == [0.5, 1.0, 0.5, 1.0] and w[16:18] == [1.0, 2.0], "low nibble first; scale groups of 16 columns")
    w = dequant_py(bytes([0x77] * 8), bytes([0x7F]), 1.0, 1, 16)
    check(all(same(v, 0.0) for v in w), "a NaN scale byte (0x7F) makes its group +0.0")
    w = dequant_py(bytes([0xFF] * 8), bytes([0xFF]), 1.0, 1, 16)
    check(all(same(v, -0.0) for v in w), "code 0xF (-6) with scale 0xFF: -6 * +0.0 = -0.0, no NaN")

    if model_dir and os.path.exists(os.path.join(model_dir, "model.safetensors")):
        print(f"self-check: the checkpoint of {os.path.relpath(model_dir, REPO)}, pure python")
        mats, nan_bytes = pure_python_dequant(model_dir)
        n_vals = sum(len(v[2]) for v in mats.values())
        finite = all(math.isfinite(x) for v in mats.values() for x in v[2])
        check(len(mats) > 0, f"{len(mats)} NVFP4 matrices, {n_vals} weights")
        check(nan_bytes > 0, f"{nan_bytes} NaN scale bytes (0x7F/0xFF) among them")
        check(finite, "every dequantised weight is finite")
        print(f"  dequantised experts sha256 (f32 LE, stems sorted): {digest(mats)}")
    if failures:
        print(f"self-check FAILED: {len(failures)} check(s)")
        return 1
    print("self-check passed")
    return 0


# ----------------------------------------------------------------------------------------------
# the transformers run
# ----------------------------------------------------------------------------------------------


def load_checkpoint_torch(folder):
    """{name: tensor} with safe_open (framework="pt"); F8_E4M3 tensors as their raw bytes (uint8),
    checked against the file's bytes read directly."""
    import torch
    from safetensors import safe_open

    raw = read_raw(folder)
    out, dtypes = {}, {}
    for fname in checkpoint_files(folder):
        with safe_open(os.path.join(folder, fname), framework="pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                dt = raw[name][0]
                dtypes[name] = dt
                if dt == "F8_E4M3":
                    t = t.view(torch.uint8)  # reinterpret the bits; nothing is decoded
                if dt in ("F8_E4M3", "U8"):
                    got = bytes(t.contiguous().flatten().tolist())
                    assert got == raw[name][2], f"{name}: the bytes torch holds differ from the file's"
                out[name] = t
    return out, dtypes


def dequant_torch(codes, scales, macro):
    """codes uint8 [out, in/2], scales uint8 [out, in/16], macro float32 0-dim -> float32 [out, in]."""
    import torch

    e2m1_t = torch.tensor([e2m1(c) for c in range(16)], dtype=torch.float32)
    e4m3_t = torch.tensor([e4m3(b) for b in range(256)], dtype=torch.float32)
    rows, half = codes.shape
    nibbles = torch.stack([codes & 0x0F, codes >> 4], dim=-1).reshape(rows, 2 * half)  # 2i low
    values = e2m1_t[nibbles.long()]
    scale = e4m3_t[scales.long()].repeat_interleave(GROUP, dim=1)
    assert scale.shape == values.shape, (scale.shape, values.shape)
    assert macro.dtype == torch.float32 and macro.numel() == 1
    return (values * scale) * macro.reshape(())  # f32, left to right


def build_state_dict(tensors, dtypes):
    """The checkpoint as transformers' runtime state dict: every NVFP4 matrix dequantised (and
    checked bit for bit against the pure-python decoding), experts fused, n-gram shards joined."""
    import torch
    from make_fixtures import fuse_state_dict

    per_expert, notes = {}, {"matrices": 0, "weights": 0, "nan_scale_bytes": 0, "input_scales": {}, "global_scales": {}}
    mats_py = {}
    for stem in nvfp4_stems(n for n in tensors if dtypes[n] == "U8"):
        codes = tensors[stem + ".weight"]
        scales = tensors[stem + ".weight_scale"]
        macro = tensors[stem + ".weight_scale_2"].to(torch.float32)
        assert dtypes[stem + ".weight_scale_2"] == "F32", stem
        rows, cols = codes.shape[0], codes.shape[1] * 2
        assert tuple(scales.shape) == (rows, cols // GROUP), f"{stem}.weight_scale: {tuple(scales.shape)}"
        w = dequant_torch(codes, scales, macro)
        py = dequant_py(bytes(codes.flatten().tolist()), bytes(scales.flatten().tolist()), float(macro), rows, cols)
        want = torch.tensor(py, dtype=torch.float32).reshape(rows, cols)
        assert torch.equal(w.view(torch.int32), want.view(torch.int32)), f"{stem}: torch and pure-python dequantisation differ"
        mats_py[stem] = (rows, cols, py)
        per_expert[stem + ".weight"] = w
        notes["matrices"] += 1
        notes["weights"] += rows * cols
        notes["nan_scale_bytes"] += int(((scales & 0x7F) == 0x7F).sum())
        notes["global_scales"][stem] = float(macro)
        iscale = tensors.get(stem + ".input_scale")
        if iscale is not None:
            notes["input_scales"][stem] = float(iscale)
    notes["dequantised_sha256"] = digest(mats_py)
    consumed = {f"{s}{x}" for s in (k[: -len(".weight")] for k in per_expert) for x in (".weight", ".weight_scale", ".weight_scale_2", ".input_scale")}
    sd = dict(per_expert)
    for name, t in tensors.items():
        if name in consumed:
            continue
        assert dtypes[name] in ("F32", "I64"), f"{name}: {dtypes[name]}, expected F32 (the trunk) or I64 (PLE buffers)"
        sd[name] = t
    # A composite checkpoint's `model.language_model.` is the CausalLM's `model.`.
    sd = {("model." + k[len("model.language_model.") :] if k.startswith("model.language_model.") else k): v for k, v in sd.items()}
    return fuse_state_dict(sd), notes


def load_into(model, sd):
    """Loads sd into the model after checking it key for key; the int64 buffers must equal the
    model's own (computed from the config)."""
    import torch

    own = model.state_dict()
    missing = sorted(set(own) - set(sd))
    unexpected = sorted(set(sd) - set(own))
    assert not missing and not unexpected, f"state dict mismatch: missing {missing}, unexpected {unexpected}"
    buffers = {}
    for k, v in sd.items():
        assert tuple(v.shape) == tuple(own[k].shape), f"{k}: shape {tuple(v.shape)}, model {tuple(own[k].shape)}"
        assert v.dtype == own[k].dtype, f"{k}: dtype {v.dtype}, model {own[k].dtype}"
        if not v.is_floating_point():
            assert torch.equal(v, own[k]), f"{k}: checkpoint {v.tolist()} != transformers {own[k].tolist()}"
            buffers[k] = v.tolist()
    model.load_state_dict(sd, strict=True)
    after = model.state_dict()
    for k, v in sd.items():
        assert torch.equal(after[k].contiguous().view(torch.uint8), v.contiguous().view(torch.uint8)), f"{k}: not loaded bit for bit"
    return {"tensors": len(sd), "int64_buffers_equal_transformers": buffers}


def run(model_dir):
    import torch

    sys.path.insert(0, HERE)
    import make_fixtures as mf  # needs torch: imported only here

    torch.set_grad_enabled(False)
    transformers, cfgmod, _ = mf.hf()
    import safetensors

    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    print(f"command: python3 scripts/make_nvfp4_fixture.py --model {os.path.relpath(model_dir, REPO)}")
    print(f"date: {started}")
    print(f"python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}, safetensors {safetensors.__version__}")
    print(f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}; everything on the CPU in float32")

    with open(os.path.join(model_dir, "config.json")) as f:
        config_json = json.load(f)
    cfg = cfgmod.Qwen4ExpTextConfig.from_pretrained(model_dir)
    assert list(cfg.layer_types) == list(config_json["layer_types"]), (cfg.layer_types, config_json["layer_types"])
    sparse = sorted(set(cfg.layer_types) - {"linear_attention"})
    print(f"config: {cfg.num_hidden_layers} layers {list(cfg.layer_types)}, H {cfg.hidden_size}, vocab {cfg.vocab_size}, "
          f"{cfg.num_experts} experts top-{cfg.num_experts_per_tok}, I {cfg.moe_intermediate_size}, PLE ids {cfg.ple_layer_ids}")

    tensors, dtypes = load_checkpoint_torch(model_dir)
    sd, qnotes = build_state_dict(tensors, dtypes)
    print(f"experts: {qnotes['matrices']} NVFP4 matrices ({qnotes['weights']} weights, {qnotes['nan_scale_bytes']} NaN scale bytes) "
          f"dequantised in f32; torch == pure python bit for bit; sha256 {qnotes['dequantised_sha256']}")

    model, impl = mf.build_model(cfg, SYNTH_SEED)  # every parameter is then replaced from the checkpoint
    for i, layer in enumerate(model.model.layers):
        if cfg.layer_types[i] != "linear_attention":
            assert hasattr(layer, "self_attn") and hasattr(layer.self_attn, "indexer"), f"layer {i} has no indexer"
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in model.parameters())
    loaded = load_into(model, sd)
    print(f"state dict: {loaded['tensors']} tensors loaded bit for bit; int64 PLE buffers equal transformers' "
          f"({len(loaded['int64_buffers_equal_transformers'])}); impl {impl}")

    eos = cfg.eos_token_id[0] if isinstance(cfg.eos_token_id, (list, tuple)) else cfg.eos_token_id
    spec = dict(PROMPT, eos_id=eos, description="NVFP4 fixture", seed=SYNTH_SEED)
    prompt, pseed, res, tried = mf.find_prompt(model, spec, cfg)
    sparse_check = mf.check_sparse(spec, cfg, res)
    print(f"prompt (seed {pseed}): {prompt}")
    print(f"greedy: {res['greedy_ids'].tolist()}")
    print(f"max|logit| {res['max_abs_logit']:.4f}  topk gap {res['min_topk_rel_gap']:.3e}  argmax gap {res['min_greedy_argmax_rel_gap']:.3e}  "
          f"chunked diff {res['chunked_vs_full_max_diff']:.3e}  decode diff {res['decode_vs_full_max_diff']:.3e}")

    meta = mf.base_meta(spec, cfg, list(config_json["layer_types"]), ",".join(sparse), [], impl, SYNTH_SEED, {}, [], 1.0, prompt, pseed, res, tried)
    meta.update(
        name="tiny-nvfp4",
        description="graphrun synth checkpoint, flat qwen4_exp_text config, f32 trunk, routed experts in ModelOpt NVFP4 "
        "(per-expert U8 codes, F8_E4M3 scales with NaN codes among them, f32 global and input scales, hf_quant_config.json); "
        f"3 layers (GDN, GDN+PLE, QSA), hc 2, {cfg.num_experts} experts top-{cfg.num_experts_per_tok}",
        python_version=platform.python_version(),
        safetensors_version=safetensors.__version__,
        date_utc=started,
        weight_seed=SYNTH_SEED,
        checkpoint_sha256=file_sha256(os.path.join(model_dir, "model.safetensors")),
        init={
            "source": f"every tensor from the committed checkpoint, written by `{SYNTH_COMMAND}` (CONFIG: the fixture's config.json)",
            "module_construction_seed": SYNTH_SEED,
            "note": "the module's own init is overwritten entirely (load_state_dict strict, checked bit for bit); no perturbation, "
            "no lm_head rescale, no bf16 rounding",
        },
        dequantisation={
            "formula": "w[r][c] = (e2m1(code) * e4m3(scale)) * weight_scale_2, float32, left to right (docs/spec moe-nvfp4-loader B.4)",
            "codes": "U8 [out, in/2]; element 2i is the low nibble; E2M1 table [0,0.5,1,1.5,2,3,4,6], bit 3 the sign",
            "scales": "F8_E4M3 [out, in/16] read as raw bytes (not decoded by torch); bit 7 sign, bits 6..3 exponent bias 7, "
            "bits 2..0 mantissa, subnormals m/8*2^-6; 0x7F and 0xFF (NaN codes) -> +0.0 (ModelOpt convention)",
            "assembly": "per expert e: gate_up_proj[e] = cat(gate_proj, up_proj) rows [2I, H] (gate rows first), down_proj[e] [H, I] "
            "(make_fixtures.fuse_state_dict); input_scale read and unused",
            "checks": "torch's F8_E4M3/U8 bytes == the file's; vectorised torch dequantisation == element-by-element pure python, bit for bit",
            **qnotes,
        },
        state_dict=loaded,
        sparse_check=sparse_check,
        hf_reload_checks="not run: transformers does not load this ModelOpt NVFP4 layout without a quantizer; the model is built and loaded by the script",
    )
    meta_text = json.dumps(mf.json_safe(meta), indent=2, allow_nan=False)
    mf.save_expected(model_dir, prompt, res)
    with open(os.path.join(model_dir, "meta.json"), "w") as f:
        f.write(meta_text)
        f.write("\n")
    for name in ("expected.safetensors", "meta.json"):
        p = os.path.join(model_dir, name)
        print(f"wrote {os.path.relpath(p, REPO)} ({os.path.getsize(p)} bytes)")


def file_sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL, help="the fixture folder (default: tests/fixtures/tiny-nvfp4)")
    ap.add_argument("--self-check", action="store_true", help="check the decoding against the spec (no torch needed)")
    args = ap.parse_args()
    model_dir = os.path.abspath(args.model)
    if args.self_check:
        sys.exit(self_check(model_dir))
    if self_check(model_dir) != 0:
        sys.exit("the self-check failed: nothing written")
    run(model_dir)


if __name__ == "__main__":
    main()
