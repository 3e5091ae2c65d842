//! The Gated DeltaNet kernels (`kernels/gdn.cu`: causal convolution with its window, gates,
//! recurrence, and the fused forms) against the CPU reference (`ops::conv::causal_conv`, `ops::gdn`) on fresh random
//! inputs, at tiny shapes, odd shapes (partial warps and column groups) and the real Qwen4Exp
//! shapes, with windows and states carried across calls.
//!
//! Runs where a CUDA device is present (the GPU machine: `scripts/gpu_tests.sh`, logs in
//! `results/`). Elsewhere (CI) it says so and checks nothing else.
//!
//! Bounds: 1e-5 relative (‖gpu − cpu‖ / ‖cpu‖, and 1e-4 for max |diff| / max |cpu|), as
//! `gpu_kernels.rs`. Carrying: 5 rows then 3 give exactly (bit for bit) what 8 rows at once give,
//! on the CPU and on the GPU (the GPU's order of operations does not depend on the split: the
//! window and state round-trip through memory as f32, as they are held).

mod common;

use common::gpu::*;
use cudarc::driver::CudaSlice;
use graphrun::exec::cuda::launch::gdn::{self, GdnLayout};
use graphrun::exec::cuda::Launch;
use graphrun::ir::GateActivation;
use graphrun::ops::conv;
use graphrun::ops::gdn::{self as cpu_gdn, GdnShape};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

fn down(gpu: &Launch, s: &CudaSlice<f32>) -> Vec<f32> {
    gpu.download(s, "result").unwrap()
}

#[test]
fn causal_conv_matches_the_cpu_reference() {
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);
    let mut rng = ChaCha8Rng::seed_from_u64(0xc0a7);
    let mut report = Report(Vec::new());
    // (width, kernel, dilation): tiny; odd width with kernel 3, dilation 2; 9 taps (more than
    // causal_conv_rows_f32 holds); the real GDN conv (10240, kernel 4) and the real PLE conv
    // (10240, kernel 4, dilation 3: past 9 > 5 and 3 rows).
    for (width, kernel, dilation) in [
        (16, 4, 1),
        (16, 4, 3),
        (37, 3, 2),
        (33, 9, 1),
        (10240, 4, 1),
        (10240, 4, 3),
    ] {
        let past = (kernel - 1) * dilation;
        let w = random_scaled(&mut rng, width * kernel, 1.0);
        let dw = gpu.upload(&w, "w").unwrap();
        for silu in [true, false] {
            // One step of 1 (decode) and of 64 rows (prefill), from a non-zero window.
            for rows in [1usize, 64] {
                let x = random_scaled(&mut rng, rows * width, 1.0);
                let window0 = random_scaled(&mut rng, past * width, 1.0);
                let mut cpu_window = window0.clone();
                let want = conv::causal_conv(&x, &mut cpu_window, &w, rows, kernel, dilation, silu);
                let dx = gpu.upload(&x, "x").unwrap();
                let mut dwin = gpu.upload(&window0, "window").unwrap();
                let y = gdn::causal_conv(
                    &gpu,
                    &dx,
                    &mut dwin,
                    &dw,
                    rows,
                    kernel,
                    dilation,
                    silu,
                    conv_kernel(rows, kernel),
                )
                .unwrap();
                let s = format!("T{rows} C{width} K{kernel} d{dilation} silu{}", silu as u8);
                // Up to 8 rows: causal_conv_step_f32 (one launch); more: the convolution (a thread
                // per channel and run of rows up to 8 taps, else per value), then the shift.
                let (conv, shift) = if rows <= 8 {
                    ("causal_conv_step_f32", "causal_conv_step_f32 window")
                } else if kernel <= 8 {
                    ("causal_conv_rows_f32", "causal_conv_window_f32")
                } else {
                    ("causal_conv_reference_f32", "causal_conv_window_f32")
                };
                report.check(conv, &s, &down(&gpu, &y), &want);
                report.check(shift, &s, &down(&gpu, &dwin), &cpu_window);
            }

            // Three decode steps, the window carried on both sides (one row of dilation 1 takes
            // its window and taps into registers before the kernel's wait).
            let window0 = random_scaled(&mut rng, past * width, 1.0);
            let mut cpu_window = window0.clone();
            let mut dwin = gpu.upload(&window0, "window").unwrap();
            for step in 0..3 {
                let x = random_scaled(&mut rng, width, 1.0);
                let want = conv::causal_conv(&x, &mut cpu_window, &w, 1, kernel, dilation, silu);
                let dx = gpu.upload(&x, "x").unwrap();
                let y = gdn::causal_conv(
                    &gpu,
                    &dx,
                    &mut dwin,
                    &dw,
                    1,
                    kernel,
                    dilation,
                    silu,
                    conv_kernel(1, kernel),
                )
                .unwrap();
                let s = format!(
                    "step {step} of 1 C{width} K{kernel} d{dilation} silu{}",
                    silu as u8
                );
                report.check("causal_conv_step_f32", &s, &down(&gpu, &y), &want);
                report.check(
                    "causal_conv_step_f32 window",
                    &s,
                    &down(&gpu, &dwin),
                    &cpu_window,
                );
            }

            // 8 rows at once, and 5 then 3 with the window carried, on both sides.
            let x = random_scaled(&mut rng, 8 * width, 1.0);
            let window0 = random_scaled(&mut rng, past * width, 1.0);
            let (x5, x3) = x.split_at(5 * width);
            let mut cpu_whole_window = window0.clone();
            let cpu_whole =
                conv::causal_conv(&x, &mut cpu_whole_window, &w, 8, kernel, dilation, silu);
            let mut cpu_split_window = window0.clone();
            let mut cpu_split =
                conv::causal_conv(x5, &mut cpu_split_window, &w, 5, kernel, dilation, silu);
            cpu_split.extend(conv::causal_conv(
                x3,
                &mut cpu_split_window,
                &w,
                3,
                kernel,
                dilation,
                silu,
            ));
            let s = format!("T5+3 C{width} K{kernel} d{dilation} silu{}", silu as u8);
            report.same("causal_conv (cpu)", &s, &cpu_split, &cpu_whole);
            report.same(
                "causal_conv window (cpu)",
                &s,
                &cpu_split_window,
                &cpu_whole_window,
            );

            let dx = gpu.upload(&x, "x").unwrap();
            let mut dwin = gpu.upload(&window0, "window").unwrap();
            let gpu_whole = down(
                &gpu,
                &gdn::causal_conv(
                    &gpu,
                    &dx,
                    &mut dwin,
                    &dw,
                    8,
                    kernel,
                    dilation,
                    silu,
                    conv_kernel(8, kernel),
                )
                .unwrap(),
            );
            let gpu_whole_window = down(&gpu, &dwin);
            let (dx5, dx3) = (gpu.upload(x5, "x5").unwrap(), gpu.upload(x3, "x3").unwrap());
            let mut dwin = gpu.upload(&window0, "window").unwrap();
            let mut gpu_split = down(
                &gpu,
                &gdn::causal_conv(
                    &gpu,
                    &dx5,
                    &mut dwin,
                    &dw,
                    5,
                    kernel,
                    dilation,
                    silu,
                    conv_kernel(5, kernel),
                )
                .unwrap(),
            );
            gpu_split.extend(down(
                &gpu,
                &gdn::causal_conv(
                    &gpu,
                    &dx3,
                    &mut dwin,
                    &dw,
                    3,
                    kernel,
                    dilation,
                    silu,
                    conv_kernel(3, kernel),
                )
                .unwrap(),
            ));
            let gpu_split_window = down(&gpu, &dwin);
            report.same("causal_conv_reference_f32", &s, &gpu_split, &gpu_whole);
            report.same(
                "causal_conv_window_f32",
                &s,
                &gpu_split_window,
                &gpu_whole_window,
            );
            report.check("causal_conv_reference_f32", &s, &gpu_split, &cpu_whole);
            report.check(
                "causal_conv_window_f32",
                &s,
                &gpu_split_window,
                &cpu_whole_window,
            );
        }
    }
    gpu.sync("the causal_conv checks").unwrap();
    println!("{} causal_conv checks passed", report.0.len());
}

#[test]
fn gdn_gates_match_the_cpu_reference() {
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);
    let mut rng = ChaCha8Rng::seed_from_u64(0x6a7e);
    let mut report = Report(Vec::new());
    // Tiny, and the real 48 value heads at decode and prefill. `a` spans ±25 so that a + dt_bias
    // falls on both sides of softplus's threshold (20).
    for (rows, heads) in [(3usize, 4usize), (1, 48), (64, 48)] {
        let b = random_scaled(&mut rng, rows * heads, 4.0);
        let a = random_scaled(&mut rng, rows * heads, 25.0);
        let a_log = random_scaled(&mut rng, heads, 2.0);
        let dt_bias = random_scaled(&mut rng, heads, 1.0);
        let (want_beta, want_g) = cpu_gdn::gates(&b, &a, &a_log, &dt_bias);
        let up = |v: &[f32]| gpu.upload(v, "gates input").unwrap();
        let (beta, g) = gdn::gdn_gates(
            &gpu,
            &up(&b),
            &up(&a),
            &up(&a_log),
            &up(&dt_bias),
            rows,
            heads,
        )
        .unwrap();
        let s = format!("T{rows} heads {heads}");
        report.check(
            "gdn_gates_reference_f32 beta",
            &s,
            &down(&gpu, &beta),
            &want_beta,
        );
        report.check("gdn_gates_reference_f32 g", &s, &down(&gpu, &g), &want_g);
    }
    gpu.sync("the gdn_gates checks").unwrap();
    println!("{} gdn_gates checks passed", report.0.len());
}

/// The recurrence's gates as `gdn_gates` makes them.
fn given<'a>(beta: &'a CudaSlice<f32>, g: &'a CudaSlice<f32>) -> gdn::GdnGates<'a> {
    gdn::GdnGates::Given { beta, g }
}

/// The gates' own inputs: `b`, `a [rows, Vh]`, `A_log`, `dt_bias [Vh]`.
type RawGates = [Vec<f32>; 4];

/// Random `qkv`, and `beta`, `g` from the reference gates on random inputs (`a_shift` moves
/// `a`: very negative gives g close to 0, a slow decay that lets the state accumulate), and
/// those inputs.
fn recurrence_inputs(
    rng: &mut ChaCha8Rng,
    rows: usize,
    s: &GdnShape,
    a_shift: f32,
) -> (Vec<f32>, Vec<f32>, Vec<f32>, RawGates) {
    let width = 2 * s.key_heads * s.key_dim + s.value_heads * s.value_dim;
    let qkv = random_scaled(rng, rows * width, 1.0);
    let b = random_scaled(rng, rows * s.value_heads, 2.0);
    let a: Vec<f32> = random_scaled(rng, rows * s.value_heads, 1.0)
        .into_iter()
        .map(|v| v + a_shift)
        .collect();
    let a_log = random_scaled(rng, s.value_heads, 1.0);
    let dt_bias = random_scaled(rng, s.value_heads, 1.0);
    let (beta, g) = cpu_gdn::gates(&b, &a, &a_log, &dt_bias);
    (qkv, beta, g, [b, a, a_log, dt_bias])
}

#[test]
fn gdn_recurrence_matches_the_cpu_reference() {
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);
    let mut rng = ChaCha8Rng::seed_from_u64(0x9d17);
    let mut report = Report(Vec::new());
    let shapes = [
        // tiny
        GdnShape {
            key_heads: 2,
            value_heads: 4,
            key_dim: 8,
            value_dim: 8,
        },
        // odd: a partial second warp of rows and a partial second group of columns
        GdnShape {
            key_heads: 1,
            value_heads: 3,
            key_dim: 40,
            value_dim: 40,
        },
        // odd for the warp layout: rows not a multiple of 4, a partial group of 8 columns
        GdnShape {
            key_heads: 2,
            value_heads: 2,
            key_dim: 37,
            value_dim: 12,
        },
        // real
        GdnShape {
            key_heads: 16,
            value_heads: 48,
            key_dim: 128,
            value_dim: 128,
        },
    ];
    for s in &shapes {
        let name = format!(
            "Kh{} Vh{} dk{} dv{}",
            s.key_heads, s.value_heads, s.key_dim, s.value_dim
        );
        let state_len = s.value_heads * s.key_dim * s.value_dim;
        // Decode and prefill, the gates' decay as they come (a around 0) and slow (a around -6:
        // exp(g) close to 1, the state keeps most of 64 tokens).
        for (rows, a_shift) in [(1usize, 0.0f32), (64, 0.0), (64, -6.0)] {
            let (qkv, beta, g, raw) = recurrence_inputs(&mut rng, rows, s, a_shift);
            let state0 = random_scaled(&mut rng, state_len, 1.0);
            let mut cpu_state = state0.clone();
            let want = cpu_gdn::recurrence(&qkv, &beta, &g, &mut cpu_state, rows, s);
            let (dq, db, dg) = (
                gpu.upload(&qkv, "qkv").unwrap(),
                gpu.upload(&beta, "beta").unwrap(),
                gpu.upload(&g, "g").unwrap(),
            );
            // The gates formed in the kernel (`Op::GdnGatedRecurrence`): against the CPU's
            // gates-then-recurrence. (Not bit for bit the two-kernel result: the same expressions
            // compiled into one kernel round differently at 64 tokens, within 1e-7 of the CPU.)
            let mut cpu_state2 = state0.clone();
            let want2 = cpu_gdn::gated_recurrence(
                &qkv,
                &raw[0],
                &raw[1],
                &raw[2],
                &raw[3],
                &mut cpu_state2,
                rows,
                s,
            );
            let draw: Vec<_> = raw
                .iter()
                .map(|v| gpu.upload(v, "gate input").unwrap())
                .collect();
            for layout in GdnLayout::ALL {
                let sh = format!("T{rows} {name} a{a_shift:+} {layout:?}");
                let mut dstate = gpu.upload(&state0, "state").unwrap();
                let o = gdn::gdn_recurrence_with(
                    &gpu,
                    &dq,
                    given(&db, &dg),
                    &mut dstate,
                    rows,
                    s,
                    layout,
                )
                .unwrap();
                report.check("gdn_recurrence o", &sh, &down(&gpu, &o), &want);
                report.check("gdn_recurrence S", &sh, &down(&gpu, &dstate), &cpu_state);
                let mut dstate2 = gpu.upload(&state0, "state").unwrap();
                let gates = gdn::GdnGates::Raw {
                    b: &draw[0],
                    a: &draw[1],
                    a_log: &draw[2],
                    dt_bias: &draw[3],
                };
                let o2 = gdn::gdn_recurrence_with(&gpu, &dq, gates, &mut dstate2, rows, s, layout)
                    .unwrap();
                let (o2, s2) = (down(&gpu, &o2), down(&gpu, &dstate2));
                report.check("gdn_gated_recurrence o", &sh, &o2, &want2);
                report.check("gdn_gated_recurrence S", &sh, &s2, &cpu_state2);
            }
        }

        // 8 rows at once, and 5 then 3 with the state carried, on both sides.
        let (qkv, beta, g, _) = recurrence_inputs(&mut rng, 8, s, 0.0);
        let state0 = random_scaled(&mut rng, state_len, 1.0);
        let width = qkv.len() / 8;
        let vh = s.value_heads;
        let (q5, q3) = qkv.split_at(5 * width);
        let (b5, b3) = beta.split_at(5 * vh);
        let (g5, g3) = g.split_at(5 * vh);
        let mut cpu_whole_state = state0.clone();
        let cpu_whole = cpu_gdn::recurrence(&qkv, &beta, &g, &mut cpu_whole_state, 8, s);
        let mut cpu_split_state = state0.clone();
        let mut cpu_split = cpu_gdn::recurrence(q5, b5, g5, &mut cpu_split_state, 5, s);
        cpu_split.extend(cpu_gdn::recurrence(q3, b3, g3, &mut cpu_split_state, 3, s));
        let sh = format!("T5+3 {name}");
        report.same("gdn_recurrence o (cpu)", &sh, &cpu_split, &cpu_whole);
        report.same(
            "gdn_recurrence S (cpu)",
            &sh,
            &cpu_split_state,
            &cpu_whole_state,
        );

        let up = |v: &[f32]| gpu.upload(v, "recurrence input").unwrap();
        for layout in GdnLayout::ALL {
            let sh = format!("T5+3 {name} {layout:?}");
            let run = |q: &[f32], b: &[f32], g: &[f32], state: &mut CudaSlice<f32>, rows| {
                let o = gdn::gdn_recurrence_with(
                    &gpu,
                    &up(q),
                    given(&up(b), &up(g)),
                    state,
                    rows,
                    s,
                    layout,
                )
                .unwrap();
                down(&gpu, &o)
            };
            let mut dstate = up(&state0);
            let gpu_whole = run(&qkv, &beta, &g, &mut dstate, 8);
            let gpu_whole_state = down(&gpu, &dstate);
            let mut dstate = up(&state0);
            let mut gpu_split = run(q5, b5, g5, &mut dstate, 5);
            gpu_split.extend(run(q3, b3, g3, &mut dstate, 3));
            let gpu_split_state = down(&gpu, &dstate);
            report.same("gdn_recurrence o", &sh, &gpu_split, &gpu_whole);
            report.same("gdn_recurrence S", &sh, &gpu_split_state, &gpu_whole_state);
            report.check("gdn_recurrence o", &sh, &gpu_split, &cpu_whole);
            report.check("gdn_recurrence S", &sh, &gpu_split_state, &cpu_whole_state);
        }
    }
    gpu.sync("the gdn_recurrence checks").unwrap();
    println!("{} gdn_recurrence checks passed", report.0.len());
}

/// The recurrence with the output norm as its epilogue (`gdn_normed_recurrence_f32`, one block a
/// value head) against the CPU's composition (`ops::gdn::normed_recurrence`: the gated
/// recurrence, then `norm::gated_rms_norm` over each head's dv outputs), for both gate
/// activations, from a random state; the state after the step too.
#[test]
fn gdn_normed_recurrence_matches_the_cpu_composition() {
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);
    let mut rng = ChaCha8Rng::seed_from_u64(0x4e0a);
    let mut report = Report(Vec::new());
    let eps = 1e-6f32;
    let shapes = [
        // real
        GdnShape {
            key_heads: 16,
            value_heads: 48,
            key_dim: 128,
            value_dim: 128,
        },
        // odd: rows not a multiple of 4 (a partial row group), 3 warps of columns
        GdnShape {
            key_heads: 2,
            value_heads: 4,
            key_dim: 37,
            value_dim: 24,
        },
        // ragged: a partial last warp whose last pair has one column
        GdnShape {
            key_heads: 1,
            value_heads: 3,
            key_dim: 8,
            value_dim: 13,
        },
    ];
    for s in &shapes {
        let name = format!(
            "Kh{} Vh{} dk{} dv{}",
            s.key_heads, s.value_heads, s.key_dim, s.value_dim
        );
        let state_len = s.value_heads * s.key_dim * s.value_dim;
        let norm_w = random_scaled(&mut rng, s.value_dim, 1.0);
        let dw = gpu.upload(&norm_w, "norm weight").unwrap();
        // Decode, a few rows, and (past what the fusion's predicate gives the kernel) two
        // chunks of its staging.
        for rows in [1usize, 3, 11] {
            for act in [GateActivation::Sigmoid, GateActivation::Silu] {
                let (qkv, _, _, raw) = recurrence_inputs(&mut rng, rows, s, 0.0);
                let z = random_scaled(&mut rng, rows * s.value_heads * s.value_dim, 3.0);
                let state0 = random_scaled(&mut rng, state_len, 1.0);
                let mut cpu_state = state0.clone();
                let want = cpu_gdn::normed_recurrence(
                    &qkv,
                    &raw[0],
                    &raw[1],
                    &raw[2],
                    &raw[3],
                    &z,
                    &norm_w,
                    &mut cpu_state,
                    rows,
                    s,
                    act,
                    eps,
                );
                let up = |v: &[f32]| gpu.upload(v, "normed recurrence input").unwrap();
                let mut dstate = up(&state0);
                let y = gdn::gdn_normed_recurrence(
                    &gpu,
                    &up(&qkv),
                    &up(&raw[0]),
                    &up(&raw[1]),
                    &up(&raw[2]),
                    &up(&raw[3]),
                    &up(&z),
                    &dw,
                    &mut dstate,
                    rows,
                    s,
                    act == GateActivation::Sigmoid,
                    eps,
                )
                .unwrap();
                let sh = format!("T{rows} {name} {act:?}");
                report.check("gdn_normed_recurrence y", &sh, &down(&gpu, &y), &want);
                report.check(
                    "gdn_normed_recurrence S",
                    &sh,
                    &down(&gpu, &dstate),
                    &cpu_state,
                );
            }
        }
    }
    gpu.sync("the gdn_normed_recurrence checks").unwrap();
    println!("{} gdn_normed_recurrence checks passed", report.0.len());
}

/// The convolution folded into the normed recurrence (`gdn_conv_normed_recurrence_f32`: a block
/// a value head convolving the q and k channels of its key head and its own v channels, the
/// value heads of a key head meeting at an arrival counter) over consecutive steps from a random
/// window and state,
/// both carried on every side: against the CPU's composition (`ops::gdn::conv_normed_recurrence`:
/// `conv::causal_conv`, then `normed_recurrence`), the output and both states; and bit for bit
/// against the unfused kernels (`causal_conv`, then `gdn_normed_recurrence`) on the same inputs.
#[test]
fn gdn_conv_normed_recurrence_matches_the_cpu_and_the_unfused_kernels() {
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);
    let mut rng = ChaCha8Rng::seed_from_u64(0xc0f5);
    let mut report = Report(Vec::new());
    let eps = 1e-6f32;
    let shape = |key_heads, value_heads, key_dim, value_dim| GdnShape {
        key_heads,
        value_heads,
        key_dim,
        value_dim,
    };
    // (shape, the conv's taps)
    let cases = [
        // real: 16 key heads of 3 value heads (3 blocks meet at each key head's counter), 384
        // channels a block of 512 threads
        (shape(16, 48, 128, 128), 4),
        // tiny: 2 value heads a key head
        (shape(2, 4, 8, 8), 4),
        // odd: 2*37 + 24 = 98 channels for 96 threads (two take a second channel), 3 taps
        (shape(2, 4, 37, 24), 3),
        // ragged: dv 13 (a partial warp's last pair has one column), one key head of 3 value heads
        (shape(1, 3, 8, 13), 4),
        // a value head a key head: no other block to wait for; 2 taps
        (shape(3, 3, 16, 16), 2),
    ];
    for (s, kernel) in cases {
        let (kh, vh, dk, dv) = (s.key_heads, s.value_heads, s.key_dim, s.value_dim);
        let name = format!("Kh{kh} Vh{vh} dk{dk} dv{dv} K{kernel}");
        assert!(
            accepts(
                "gdn_conv_normed_recurrence",
                "fused",
                &s,
                kernel,
                8,
                gpu.counter_count()
            ),
            "{name}"
        );
        let width = 2 * kh * dk + vh * dv;
        let up = |v: &[f32]| gpu.upload(v, "conv normed recurrence input").unwrap();
        let conv_w = random_scaled(&mut rng, width * kernel, 1.0);
        let norm_w = random_scaled(&mut rng, dv, 1.0);
        let a_log = random_scaled(&mut rng, vh, 1.0);
        let dt_bias = random_scaled(&mut rng, vh, 1.0);
        let (dconv, dnorm, dalog, ddt) = (up(&conv_w), up(&norm_w), up(&a_log), up(&dt_bias));
        for act in [GateActivation::Sigmoid, GateActivation::Silu] {
            let sigmoid = act == GateActivation::Sigmoid;
            let window0 = random_scaled(&mut rng, (kernel - 1) * width, 1.0);
            let state0 = random_scaled(&mut rng, vh * dk * dv, 1.0);
            let (mut cpu_window, mut cpu_state) = (window0.clone(), state0.clone());
            let (mut window, mut state) = (up(&window0), up(&state0));
            let (mut unfused_window, mut unfused_state) = (up(&window0), up(&state0));
            // Four decode steps in a row, then 3 rows and 8 (the kernel's most).
            for (step, rows) in [1usize, 1, 1, 1, 3, 8].into_iter().enumerate() {
                let qkv = random_scaled(&mut rng, rows * width, 1.0);
                let b = random_scaled(&mut rng, rows * vh, 2.0);
                let a = random_scaled(&mut rng, rows * vh, 1.0);
                let z = random_scaled(&mut rng, rows * vh * dv, 3.0);
                let want = cpu_gdn::conv_normed_recurrence(
                    &qkv,
                    &conv_w,
                    &mut cpu_window,
                    kernel,
                    &b,
                    &a,
                    &a_log,
                    &dt_bias,
                    &z,
                    &norm_w,
                    &mut cpu_state,
                    rows,
                    &s,
                    act,
                    eps,
                );
                let (dq, db, da, dz) = (up(&qkv), up(&b), up(&a), up(&z));
                let y = gdn::gdn_conv_normed_recurrence(
                    &gpu,
                    &dq,
                    &dconv,
                    &mut window,
                    &db,
                    &da,
                    &dalog,
                    &ddt,
                    &dz,
                    &dnorm,
                    &mut state,
                    rows,
                    &s,
                    kernel,
                    sigmoid,
                    eps,
                )
                .unwrap();
                let x = gdn::causal_conv(
                    &gpu,
                    &dq,
                    &mut unfused_window,
                    &dconv,
                    rows,
                    kernel,
                    1,
                    true,
                    conv_kernel(rows, kernel),
                )
                .unwrap();
                let unfused = gdn::gdn_normed_recurrence(
                    &gpu,
                    &x,
                    &db,
                    &da,
                    &dalog,
                    &ddt,
                    &dz,
                    &dnorm,
                    &mut unfused_state,
                    rows,
                    &s,
                    sigmoid,
                    eps,
                )
                .unwrap();
                let sh = format!("step {step} T{rows} {name} {act:?}");
                let (y, got_window, got_state) =
                    (down(&gpu, &y), down(&gpu, &window), down(&gpu, &state));
                report.check("gdn_conv_normed_recurrence y", &sh, &y, &want);
                // The window holds inputs: copies, the CPU's bits.
                report.same(
                    "gdn_conv_normed_recurrence window",
                    &sh,
                    &got_window,
                    &cpu_window,
                );
                report.check("gdn_conv_normed_recurrence S", &sh, &got_state, &cpu_state);
                report.same("conv_normed y == unfused", &sh, &y, &down(&gpu, &unfused));
                report.same(
                    "conv_normed window == unfused",
                    &sh,
                    &got_window,
                    &down(&gpu, &unfused_window),
                );
                report.same(
                    "conv_normed S == unfused",
                    &sh,
                    &got_state,
                    &down(&gpu, &unfused_state),
                );
            }
        }
    }
    gpu.sync("the gdn_conv_normed_recurrence checks").unwrap();
    println!(
        "{} gdn_conv_normed_recurrence checks passed",
        report.0.len()
    );
}

/// Bad shapes are errors naming the kernel, not launches.
#[test]
fn gdn_shape_errors_name_the_kernel() {
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);
    let x = gpu.upload(&[1.0f32; 32], "x").unwrap();
    let w = gpu.upload(&[1.0f32; 16 * 4], "w").unwrap();
    // Window for kernel 4, dilation 1 needs 3 rows of 16; give 2.
    let mut window = gpu.upload(&[0.0f32; 32], "window").unwrap();
    let err = gdn::causal_conv(&gpu, &x, &mut window, &w, 2, 4, 1, true, conv_kernel(2, 4))
        .expect_err("a shape error");
    assert!(
        err.to_string().contains("causal_conv_reference_f32"),
        "{err}"
    );

    let v = gpu.upload(&[0.0f32; 8], "v").unwrap();
    let err = gdn::gdn_gates(&gpu, &v, &v, &v, &v, 2, 4).expect_err("a shape error");
    assert!(err.to_string().contains("gdn_gates_reference_f32"), "{err}");

    let s = GdnShape {
        key_heads: 1,
        value_heads: 1,
        key_dim: 1024,
        value_dim: 1,
    };
    let qkv = gpu.upload(&vec![0.0f32; 2 * 1024 + 1], "qkv").unwrap();
    let one = gpu.upload(&[0.0f32], "one").unwrap();
    let mut state = gpu.upload(&vec![0.0f32; 1024], "state").unwrap();
    let err = gdn::gdn_recurrence_with(
        &gpu,
        &qkv,
        given(&one, &one),
        &mut state,
        1,
        &s,
        GdnLayout::Block,
    )
    .expect_err("a shape error: dk above the kernel's limit");
    assert!(
        err.to_string().contains("gdn_recurrence_reference_f32"),
        "{err}"
    );
    // dk 256: the block layout takes it, the warp layout (dk up to 128) refuses it.
    let s = GdnShape { key_dim: 256, ..s };
    let qkv = gpu.upload(&vec![0.0f32; 2 * 256 + 1], "qkv").unwrap();
    let mut state = gpu.upload(&vec![0.0f32; 256], "state").unwrap();
    assert!(!accepts("gdn_recurrence", "warp", &s, 0, 1, 0));
    assert!(accepts("gdn_recurrence", "reference", &s, 0, 1, 0));
    let err = gdn::gdn_recurrence_with(
        &gpu,
        &qkv,
        given(&one, &one),
        &mut state,
        1,
        &s,
        GdnLayout::WarpColumns,
    )
    .expect_err("a shape error: dk above the warp layout's limit");
    assert!(err.to_string().contains("gdn_recurrence_warp_f32"), "{err}");

    // The normed recurrence holds a head in one block: dv 129 is refused (the executor runs the
    // recurrence and the norm apart there), and so is a gate z of the wrong length.
    let up = |v: &[f32]| gpu.upload(v, "normed input").unwrap();
    let normed = |s: &GdnShape, z_len: usize| {
        let width = 2 * s.key_heads * s.key_dim + s.value_heads * s.value_dim;
        let mut state = up(&vec![0.0f32; s.value_heads * s.key_dim * s.value_dim]);
        let one = up(&[0.0f32]);
        gdn::gdn_normed_recurrence(
            &gpu,
            &up(&vec![0.0f32; width]),
            &one,
            &one,
            &one,
            &one,
            &up(&vec![0.0f32; z_len]),
            &up(&vec![1.0f32; s.value_dim]),
            &mut state,
            1,
            s,
            true,
            1e-6,
        )
    };
    let wide = GdnShape {
        key_heads: 1,
        value_heads: 1,
        key_dim: 16,
        value_dim: 129,
    };
    assert!(!accepts("gdn_normed_recurrence", "fused", &wide, 0, 1, 0));
    let err = normed(&wide, 129).expect_err("a shape error: dv above 128");
    assert!(
        err.to_string().contains("gdn_normed_recurrence_f32"),
        "{err}"
    );
    let fits = GdnShape {
        value_dim: 128,
        ..wide
    };
    assert!(accepts("gdn_normed_recurrence", "fused", &fits, 0, 1, 0));
    let err = normed(&fits, 127).expect_err("a shape error: z is short");
    assert!(
        err.to_string().contains("gdn_normed_recurrence_f32"),
        "{err}"
    );
    normed(&fits, 128).expect("the same shape with a whole z launches");
    gpu.sync("the normed recurrence's shape checks").unwrap();

    // The convolution folded in: up to 8 rows and 8 taps, any whole number of value heads a key
    // head, at most a counter's worth of key heads; more is refused (the executor runs the conv
    // and the normed recurrence apart there), and so is a window of the wrong length.
    let conv_normed = |s: &GdnShape, rows: usize, kernel: usize, window_rows: usize| {
        let width = 2 * s.key_heads * s.key_dim + s.value_heads * s.value_dim;
        let (vh, dv) = (s.value_heads, s.value_dim);
        let mut window = up(&vec![0.0f32; window_rows * width]);
        let mut state = up(&vec![0.0f32; vh * s.key_dim * dv]);
        let vhs = up(&vec![0.0f32; vh]);
        let rows_vh = up(&vec![0.0f32; rows * vh]);
        gdn::gdn_conv_normed_recurrence(
            &gpu,
            &up(&vec![0.0f32; rows * width]),
            &up(&vec![0.0f32; width * kernel]),
            &mut window,
            &rows_vh,
            &rows_vh,
            &vhs,
            &vhs,
            &up(&vec![0.0f32; rows * vh * dv]),
            &up(&vec![1.0f32; dv]),
            &mut state,
            rows,
            s,
            kernel,
            true,
            1e-6,
        )
    };
    let s = GdnShape {
        key_heads: 2,
        value_heads: 6,
        key_dim: 16,
        value_dim: 16,
    };
    let name = "gdn_conv_normed_recurrence_f32";
    for (rows, kernel, window_rows, what) in [
        (9, 4, 3, "9 rows"),
        (1, 9, 8, "9 taps"),
        (1, 4, 2, "a short window"),
    ] {
        let err = conv_normed(&s, rows, kernel, window_rows)
            .expect_err(&format!("a shape error: {what}"));
        assert!(err.to_string().contains(name), "{what}: {err}");
    }
    let counters = gpu.counter_count();
    assert!(!accepts(
        "gdn_conv_normed_recurrence",
        "fused",
        &s,
        4,
        9,
        counters
    ));
    assert!(!accepts(
        "gdn_conv_normed_recurrence",
        "fused",
        &s,
        9,
        1,
        counters
    ));
    let nine = GdnShape {
        key_heads: 1,
        value_heads: 9,
        ..s
    };
    conv_normed(&nine, 1, 4, 3).expect("9 value heads a key head launch");
    // More key heads than the device has arrival counters: refused.
    let many = GdnShape {
        key_heads: gpu.counter_count() + 1,
        value_heads: gpu.counter_count() + 1,
        ..s
    };
    assert!(!accepts(
        "gdn_conv_normed_recurrence",
        "fused",
        &many,
        4,
        1,
        counters
    ));
    let err = conv_normed(&many, 1, 4, 3).expect_err("a shape error: too many key heads");
    assert!(err.to_string().contains(name), "{err}");
    conv_normed(&s, 8, 4, 3).expect("8 rows of 4 taps, 3 value heads a key head launch");
    gpu.sync("the fused convolution's shape checks").unwrap();
}

/// The convolution kernel the rules give `rows` rows of `taps` taps (`causal_conv.cuda_step`,
/// `causal_conv.cuda_rows`).
fn conv_kernel(rows: usize, taps: usize) -> gdn::ConvKernel {
    if rows <= 8 {
        gdn::ConvKernel::Step
    } else if taps <= 8 {
        gdn::ConvKernel::Rows
    } else {
        gdn::ConvKernel::Reference
    }
}

/// Whether the CUDA variant `variant` of `op` accepts a node of head shape `s`, `taps` taps and
/// `rows` rows on a device with `counters` arrival counters (`registry::cuda::gdn`).
fn accepts(
    op: &str,
    variant: &str,
    s: &GdnShape,
    taps: usize,
    rows: usize,
    counters: usize,
) -> bool {
    use graphrun::registry::{self, DeviceFacts, NodeFacts};
    let dims = [
        ("key_heads", s.key_heads),
        ("value_heads", s.value_heads),
        ("key_dim", s.key_dim),
        ("value_dim", s.value_dim),
        ("kernel", taps),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let facts = NodeFacts {
        op: "gdn",
        tokens: rows,
        step: rows,
        dims,
        weight: None,
    };
    let device = DeviceFacts {
        arrival_counters: counters,
        ..DeviceFacts::h200()
    };
    let v = registry::find(graphrun::ir::Device::Cuda, op, variant).expect("a registry variant");
    (v.accepts)(&facts, &device).is_ok()
}
