//! The CUDA executor end to end on the parity fixtures: logits within 1e-4 relative of
//! transformers (per row, to the row's largest |logit|) and of the CPU executor, identical greedy
//! tokens, chunked prefill + decode equal to a full prefill. Runs where a CUDA device is present
//! (`scripts/gpu_tests.sh`); elsewhere it says so.

mod common;

use graphrun::exec::cuda::executor::DeviceWeights;
use graphrun::ir::LogitsMode;
use graphrun::registry::Placement;
use graphrun::runtime::{DeviceChoice, GenerateOptions, Model, ModelOptions, Sampling, Session};

const TOLERANCE: f32 = 1e-4;

fn cuda() -> ModelOptions {
    ModelOptions {
        device: DeviceChoice::Cuda,
        ..Default::default()
    }
}

#[test]
fn fixtures_on_the_gpu() {
    if !common::gpu::cuda_or_skip() {
        return;
    }
    for dir in common::fixture_dirs() {
        let exp = common::expected(&dir);
        let gpu = Model::load(&dir, cuda()).unwrap();
        let cpu = Model::load(&dir, ModelOptions::default()).unwrap();
        let name = dir.file_name().unwrap().to_string_lossy().to_string();

        let logits = gpu.session().prefill(&exp.prompt, LogitsMode::All).unwrap();
        let vs_hf = common::max_row_rel_err(&logits.data, &exp.logits, exp.vocab);
        let cpu_logits = cpu.session().prefill(&exp.prompt, LogitsMode::All).unwrap();
        let vs_cpu = common::max_row_rel_err(&logits.data, &cpu_logits.data, exp.vocab);

        let t = exp.prompt.len();
        let mut s = gpu.session();
        let mut rows = s
            .prefill(&exp.prompt[..t / 2], LogitsMode::All)
            .unwrap()
            .data;
        for &tok in &exp.prompt[t / 2..] {
            rows.extend(s.decode(tok).unwrap());
        }
        let chunked = common::max_row_rel_err(&rows, &logits.data, exp.vocab);

        let opts = GenerateOptions {
            max_new_tokens: exp.greedy.len(),
            sampling: Sampling::Greedy,
            stop_on_eos: false,
        };
        let greedy = gpu.session().generate(&exp.prompt, &opts).unwrap();

        println!(
            "{name:<22} weights {:<5} vs transformers {vs_hf:.2e}  vs cpu {vs_cpu:.2e}  chunked vs full {chunked:.2e}  greedy {}",
            gpu.weight_dtype,
            if greedy == exp.greedy { "identical" } else { "DIFFERENT" }
        );
        assert!(vs_hf <= TOLERANCE, "{name}: {vs_hf:e} from transformers");
        assert!(
            vs_cpu <= TOLERANCE,
            "{name}: {vs_cpu:e} from the CPU executor"
        );
        assert!(
            chunked <= TOLERANCE,
            "{name}: chunked prefill differs by {chunked:e}"
        );
        assert_eq!(greedy, exp.greedy, "{name}: greedy tokens");
    }
}

/// CUDA-graph replay equals eager launches bit for bit, at several positions: prefill chunks of
/// one size (the second and later are replays) and decode steps (replays from the second on).
#[test]
fn graph_replay_equals_eager() {
    if !common::gpu::cuda_or_skip() {
        return;
    }
    for dir in common::fixture_dirs() {
        let exp = common::expected(&dir);
        let graphs = Model::load(&dir, cuda()).unwrap();
        let eager = Model::load(
            &dir,
            ModelOptions {
                no_cuda_graphs: true,
                ..cuda()
            },
        )
        .unwrap();
        let run = |m: &Model| {
            let mut s = m.session();
            let mut out = Vec::new();
            for chunk in exp.prompt.chunks(4).filter(|c| c.len() == 4) {
                out.push(s.prefill(chunk, LogitsMode::All).unwrap().data);
            }
            let last = out.last().unwrap();
            let mut next = graphrun::runtime::sampling::argmax(&last[last.len() - exp.vocab..]);
            for _ in 0..12 {
                let logits = s.decode(next).unwrap();
                next = graphrun::runtime::sampling::argmax(&logits);
                out.push(logits);
            }
            (out, s.graph_replays())
        };
        let (a, replays) = run(&graphs);
        let (b, none) = run(&eager);
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        println!(
            "{name:<22} {} steps, {replays} graph replays: replay == eager bit for bit: {}",
            a.len(),
            a == b
        );
        assert_eq!(none, 0);
        assert!(replays >= 11, "{name}: only {replays} replays");
        assert!(a == b, "{name}: graph replay differs from eager launches");
    }
}

/// Programmatic dependent launch (kernels starting before the one ahead of them has finished,
/// `exec::cuda::launcher`) changes no bit: every fixture, prefill chunks and decode steps, graphs
/// and eager, with the overlap on (the default) and off.
#[test]
fn programmatic_launch_changes_no_bits() {
    if !common::gpu::cuda_or_skip() {
        return;
    }
    for dir in common::fixture_dirs() {
        let exp = common::expected(&dir);
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        for graphs in [true, false] {
            let model = Model::load(
                &dir,
                ModelOptions {
                    no_cuda_graphs: !graphs,
                    ..cuda()
                },
            )
            .unwrap();
            let run = |overlap: bool| {
                let mut s =
                    Session::with_executor(&model, model.backend.cuda().unwrap().executor());
                s.executor_mut().instrumentation.programmatic_launch = overlap;
                let mut out = s.prefill(&exp.prompt, LogitsMode::All).unwrap().data;
                for &t in exp.greedy.iter().cycle().take(10) {
                    out.extend(s.decode(t).unwrap());
                }
                (out, s.graph_replays())
            };
            let (on, replays) = run(true);
            let (off, _) = run(false);
            println!(
                "{name:<22} graphs {graphs:<5} ({replays} replays): overlap on == off bit for bit: {}",
                on == off
            );
            assert!(
                on == off,
                "{name}: programmatic launch changed the logits (graphs {graphs})"
            );
        }
    }
}

/// Synchronising after every node (the debugging mode that names a faulting kernel) computes
/// the same logits as graph replay.
#[test]
fn sync_each_node_gives_the_same_logits() {
    if !common::gpu::cuda_or_skip() {
        return;
    }
    let dir = common::repo().join("tests/fixtures/tiny-long-f32");
    let exp = common::expected(&dir);
    let normal = Model::load(&dir, cuda()).unwrap();
    let debug = Model::load(
        &dir,
        ModelOptions {
            cuda_sync_each_node: true,
            ..cuda()
        },
    )
    .unwrap();
    let run = |m: &Model| {
        let mut s = m.session();
        let mut out = s.prefill(&exp.prompt, LogitsMode::All).unwrap().data;
        for &t in &exp.greedy[..4] {
            out.extend(s.decode(t).unwrap());
        }
        (out, s.graph_replays())
    };
    let (a, _) = run(&normal);
    let (b, replays) = run(&debug);
    assert_eq!(replays, 0, "the debugging mode runs eagerly");
    assert!(a == b, "synchronising after each node changed the logits");
    println!(
        "sync-each-node: {} logits identical to the graph run",
        a.len()
    );
}

/// A prompt long enough for the prefill variants (`linear.cuda_mma` on bf16 weights and
/// `moe.cuda_expert_major`, both from 64 tokens), on every fixture model: the GPU's logits for
/// every position within the bound of the CPU's, in one chunk and in chunks of 100 + the rest.
#[test]
fn long_prompts_take_the_prefill_variants() {
    if !common::gpu::cuda_or_skip() {
        return;
    }
    for dir in common::fixture_dirs() {
        let gpu = Model::load(&dir, cuda()).unwrap();
        let cpu = Model::load(&dir, ModelOptions::default()).unwrap();
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let vocab = gpu.plan.vocab_size as u64;
        let prompt: Vec<u32> = (0..230u64)
            .map(|i| ((i * 7919 + 13) % vocab) as u32)
            .collect();

        let program = gpu
            .program(graphrun::ir::Phase::Prefill, prompt.len(), LogitsMode::All)
            .unwrap();
        let variants: std::collections::BTreeSet<String> = program
            .nodes
            .iter()
            .filter(|n| n.variant != "reference")
            .map(|n| format!("{}/{}", n.op.kind(), n.variant))
            .collect();
        // QSA's attention is fused with its norms and gate (`gated_attention` in fusions.ron).
        assert!(variants.contains("gated_attention/split"), "{variants:?}");
        if gpu.expert_format == Some(graphrun::registry::WeightFormat::Nvfp4) {
            assert!(
                variants.contains("moe_experts/nvfp4_expert_major_mma"),
                "{variants:?}"
            );
        } else if gpu.weight_dtype == "bf16" {
            assert!(
                variants.contains("linear/mma_wide")
                    && variants.contains("moe_experts/expert_major_mma"),
                "{variants:?}"
            );
        } else {
            assert!(
                variants.contains("moe_experts/expert_major"),
                "{variants:?}"
            );
        }

        let want = cpu.session().prefill(&prompt, LogitsMode::All).unwrap();
        let got = gpu.session().prefill(&prompt, LogitsMode::All).unwrap();
        let whole = common::max_row_rel_err(&got.data, &want.data, want.vocab);
        let mut s = gpu.session();
        let mut rows = s.prefill(&prompt[..100], LogitsMode::All).unwrap().data;
        rows.extend(s.prefill(&prompt[100..], LogitsMode::All).unwrap().data);
        let chunked = common::max_row_rel_err(&rows, &want.data, want.vocab);
        println!(
            "{name:<22} weights {:<5} {} tokens, variants {variants:?}: vs cpu {whole:.2e}, chunks of 100 + 130 vs cpu {chunked:.2e}",
            gpu.weight_dtype,
            prompt.len()
        );
        assert!(whole <= TOLERANCE && chunked <= TOLERANCE, "{name}");
    }
}

/// GDN value heads wider than one block of the fused normed recurrence holds (the tiny model
/// with 160-wide value heads): the CUDA executor takes the recurrence, then the norm, the
/// recurrence's output an intermediate in scratch (`Launch::intermediate`), not the node's planned
/// output slot. Eager and replayed decode steps within the bound of the CPU executor.
#[test]
fn wide_gdn_heads_take_the_unfused_launches() {
    if !common::gpu::cuda_or_skip() {
        return;
    }
    let tiny = common::repo().join("models/tiny-qwen4exp/config.json");
    let text = std::fs::read_to_string(&tiny).unwrap().replace(
        "\"linear_value_head_dim\": 16",
        "\"linear_value_head_dim\": 160",
    );
    assert!(
        text.contains("\"linear_value_head_dim\": 160"),
        "the tiny config changed"
    );
    let plan = graphrun::plan::ModelPlan::from_json_str(&text, "wide-gdn").unwrap();
    let dir = common::temp_dir("wide-gdn");
    let opts = graphrun::synth::SynthOptions {
        dtype: graphrun::synth::SynthDtype::F32,
        seed: 7,
        shard_bytes: 1 << 30,
        experts: Default::default(),
        sparse: false,
    };
    graphrun::synth::write(&plan, &text, &dir, &opts).unwrap();
    let gpu = Model::load(&dir, cuda()).unwrap();
    let cpu = Model::load(&dir, ModelOptions::default()).unwrap();
    let prompt = [5u32, 6, 7, 8, 9];
    let next = [10u32, 11, 12, 13];
    let run = |m: &Model| {
        let mut s = m.session();
        let mut out = s.prefill(&prompt, LogitsMode::Last).unwrap().data;
        for &t in &next {
            out.extend(s.decode(t).unwrap());
        }
        (out, s.graph_replays())
    };
    let (g, replays) = run(&gpu);
    let (c, _) = run(&cpu);
    let vocab = c.len() / (1 + next.len());
    let err = common::max_row_rel_err(&g, &c, vocab);
    println!(
        "wide GDN heads (dv 160): vs cpu {err:.2e} over {} steps, {replays} replayed",
        1 + next.len()
    );
    assert!(err <= TOLERANCE, "{err:e} from the CPU executor");
    assert!(replays >= 2, "decode steps replay their graphs");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A CUDA load copies each tensor from the mapped files to the device in the device's format
/// (`DeviceWeights::load`, no host copy of the model): the device then holds exactly what the
/// upload of the CPU's widened weights holds, byte for byte, on every fixture (f32, bf16, the
/// NVFP4 one's packed banks), and the model keeps no host weights.
#[test]
fn a_direct_load_places_what_the_widened_upload_places() {
    let Some(gpu) = common::gpu::gpu_or_skip() else {
        return;
    };
    for dir in common::fixture_dirs() {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let direct = Model::load(&dir, cuda()).unwrap();
        assert_eq!(direct.weights.len(), 0, "{name}: no host copy");
        let report = direct.load_report.unwrap();
        println!("{name:<22} {report}");
        let program = direct
            .program(graphrun::ir::Phase::Decode, 1, LogitsMode::Last)
            .unwrap();
        let cpu = Model::load(&dir, ModelOptions::default()).unwrap();
        let mut host = cpu.weights.clone();
        if direct.expert_format.is_some() {
            // The packed banks, as a device load of the CPU's kind would keep them.
            let ckpt = graphrun::checkpoint::Checkpoint::open_dir(&dir).unwrap();
            let quant = graphrun::quant::QuantConfig::from_model_dir(&dir).unwrap();
            let resolved = graphrun::weights::check_contract(
                &ckpt,
                &name,
                &program.weights,
                &program.consts,
                cpu.plan.moe.num_experts,
                quant.as_ref(),
            )
            .unwrap();
            host = graphrun::weights::contract::load_with(
                &ckpt,
                &resolved,
                graphrun::weights::contract::Nvfp4Load::Packed,
            )
            .unwrap();
        }
        let bf16 = direct.weight_dtype == "bf16";
        let uploaded =
            DeviceWeights::upload(&gpu, &program, &host, bf16, direct.ple_table).unwrap();
        let a = direct
            .backend
            .cuda()
            .unwrap()
            .weights
            .contents(&direct.backend.cuda().unwrap().gpu)
            .unwrap();
        let b = uploaded.contents(&gpu).unwrap();
        assert_eq!(
            a.keys().collect::<Vec<_>>(),
            b.keys().collect::<Vec<_>>(),
            "{name}"
        );
        for (k, v) in &a {
            assert!(v == &b[k], "{name}: {k} differs");
        }
    }
}

/// The n-gram table kept on the host (`--ple-table host`: each step's ids hashed and rows
/// gathered there, copied into the step): the same bits as the table on the device, over a
/// prefill, replayed decode steps and a second prefill, on every fixture with PLE; the table is
/// not on the device, and the host steps are timed.
#[test]
fn a_host_ple_table_gives_the_device_tables_bits() {
    if !common::gpu::cuda_or_skip() {
        return;
    }
    let with = |ple_table| ModelOptions {
        ple_table: Some(ple_table),
        ..cuda()
    };
    let mut tested = 0;
    for dir in common::fixture_dirs() {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let device = Model::load(&dir, with(Placement::Device)).unwrap();
        let host = Model::load(&dir, with(Placement::Host)).unwrap();
        assert_eq!(host.ple_table, Placement::Host, "{name}");
        let on_host = host.backend.cuda().unwrap().weights.host_tables().count();
        if device.plan.ple.is_none() {
            assert_eq!(on_host, 0, "{name}: no table to keep");
            continue;
        }
        tested += 1;
        assert!(on_host > 0, "{name}: the table is on the host");
        let table_bytes: usize = host
            .backend
            .cuda()
            .unwrap()
            .weights
            .host_tables()
            .map(|t| t.bytes())
            .sum();
        let (db, hb) = (
            device.backend.cuda().unwrap().weights.bytes,
            host.backend.cuda().unwrap().weights.bytes,
        );
        assert_eq!(
            db - hb,
            table_bytes,
            "{name}: the device holds all but the table"
        );
        let exp = common::expected(&dir);
        let run = |m: &Model| {
            let mut s = m.session();
            let mut out = s.prefill(&exp.prompt, LogitsMode::All).unwrap().data;
            for i in 0..6u32 {
                out.extend(s.decode(exp.prompt[i as usize % exp.prompt.len()]).unwrap());
            }
            out.extend(s.prefill(&exp.prompt[..3], LogitsMode::All).unwrap().data);
            (out, s.graph_replays())
        };
        let (a, replays_a) = run(&device);
        let (b, replays_b) = run(&host);
        assert!(a == b, "{name}: the host table changes the logits");
        assert_eq!(replays_a, replays_b, "{name}: graph replays");
        assert!(replays_b >= 4, "{name}: decode steps replay their graphs");
        let mut s = Session::with_executor(&host, host.backend.cuda().unwrap().executor());
        s.prefill(&exp.prompt, LogitsMode::Last).unwrap();
        s.executor_mut().instrumentation.host_times = Some(Default::default());
        for &t in &exp.prompt[..4] {
            s.decode(t).unwrap();
        }
        let times = s.executor_mut().instrumentation.host_times.unwrap();
        println!(
            "{name:<22} host table {table_bytes} bytes; host steps {:.1} us a replayed token",
            times.host_steps * 1e6 / times.steps.max(1) as f64
        );
        assert!(times.host_steps > 0.0, "{name}: host steps timed");
    }
    assert!(tested >= 2, "fixtures with PLE: {tested}");
}
