//! A model's weights on the device: uploaded once, matrices in their stored format.

use super::*;

/// A model's weights on the device.
pub struct DeviceWeights {
    pub(super) matrices: HashMap<String, DeviceMatrix>,
    /// NVFP4 expert banks, packed as the checkpoint stores them.
    pub(super) nvfp4: HashMap<String, DeviceNvfp4>,
    pub(super) vectors: HashMap<String, CudaSlice<f32>>,
    /// PLE hash tables per table index: multipliers, sizes, offsets.
    pub(super) ple: Vec<[CudaSlice<i64>; 3]>,
    pub bytes: usize,
}

impl DeviceWeights {
    /// Uploads every weight `program` uses: NVFP4 banks as stored, other matrices as bf16 when
    /// `bf16` (exact when the checkpoint was bf16: the host copies are its values widened).
    pub fn upload(
        gpu: &Gpu,
        program: &Program,
        weights: &Weights,
        bf16: bool,
    ) -> Result<DeviceWeights, CudaError> {
        let mut dw = DeviceWeights {
            matrices: HashMap::new(),
            nvfp4: HashMap::new(),
            vectors: HashMap::new(),
            ple: Vec::new(),
            bytes: 0,
        };
        let matrix_names = matrix_weights(program);
        for info in program
            .weights
            .iter()
            .filter(|w| w.class == WeightClass::Float)
        {
            if let Some(bank) = weights.nvfp4(&info.name) {
                let m = DeviceNvfp4::upload(gpu, bank, &info.name)?;
                dw.bytes += m.bytes();
                dw.nvfp4.insert(info.name.clone(), m);
                continue;
            }
            let Some(t) = weights.get(&info.name) else {
                continue;
            };
            if matrix_names.contains(&info.name) {
                let m = if bf16 {
                    let bits: Vec<u16> = t
                        .data
                        .iter()
                        .map(|&v| half::bf16::from_f32(v).to_bits())
                        .collect();
                    dw.bytes += bits.len() * 2;
                    DeviceMatrix::Bf16(gpu.upload(&bits, &info.name)?)
                } else {
                    dw.bytes += t.data.len() * 4;
                    DeviceMatrix::F32(gpu.upload(&t.data, &info.name)?)
                };
                dw.matrices.insert(info.name.clone(), m);
            } else {
                dw.bytes += t.data.len() * 4;
                dw.vectors
                    .insert(info.name.clone(), gpu.upload(&t.data, &info.name)?);
            }
        }
        dw.upload_ple_tables(gpu, program)?;
        Ok(dw)
    }

    /// Random weights generated on the device (benchmarks at the real geometry, no files):
    /// matrices uniform with the variance of N(0, 1/fan_in), (1+w) norms near 0, plain norms and
    /// dt_bias near 1, A_log in [0, ln 16], embeddings uniform in [-1, 1); the routed experts
    /// as NVFP4 banks with `nvfp4_experts` (`DeviceNvfp4::random`).
    pub fn random(
        gpu: &Gpu,
        program: &Program,
        bf16: bool,
        nvfp4_experts: bool,
        seed: u64,
    ) -> Result<DeviceWeights, CudaError> {
        let experts = expert_banks(program);
        let mut dw = DeviceWeights {
            matrices: HashMap::new(),
            nvfp4: HashMap::new(),
            vectors: HashMap::new(),
            ple: Vec::new(),
            bytes: 0,
        };
        let matrix_names = matrix_weights(program);
        for (i, info) in program
            .weights
            .iter()
            .filter(|w| w.class == WeightClass::Float)
            .enumerate()
        {
            let n: usize = info.shape.iter().product();
            let name = info.name.as_str();
            let fan_in = *info.shape.last().unwrap_or(&1) as f32;
            let (lo, hi) = if name.ends_with("A_log") {
                (0.0, 16f32.ln())
            } else if name.ends_with("dt_bias") || name.ends_with("linear_attn.norm.weight") {
                (0.9, 1.1)
            } else if info.shape.len() == 1 {
                (-0.1, 0.1)
            } else if name.ends_with("embed_tokens.weight")
                || name.ends_with("ngram_embedding.weight")
            {
                (-1.0, 1.0)
            } else {
                let a = (3.0 / fan_in).sqrt();
                (-a, a)
            };
            let seed_i = seed ^ ((i as u64 + 1) << 32);
            if let (true, Some(&rows_per_global), [e, out, inputs]) =
                (nvfp4_experts, experts.get(&info.name), &info.shape[..])
            {
                let cx = Launch::new(gpu);
                let m =
                    DeviceNvfp4::random(&cx, [*e, *out, *inputs], rows_per_global, seed_i, name)?;
                dw.bytes += m.bytes();
                dw.nvfp4.insert(info.name.clone(), m);
                continue;
            }
            if matrix_names.contains(&info.name) && bf16 {
                let mut m = DeviceMatrix::Bf16(gpu.zeros::<u16>(n, name)?);
                launch::fill_uniform(&Launch::new(gpu), &mut m, seed_i, lo, hi)?;
                dw.bytes += n * 2;
                dw.matrices.insert(info.name.clone(), m);
            } else {
                let mut m = DeviceMatrix::F32(gpu.zeros::<f32>(n, name)?);
                launch::fill_uniform(&Launch::new(gpu), &mut m, seed_i, lo, hi)?;
                dw.bytes += n * 4;
                match m {
                    DeviceMatrix::F32(v) if !matrix_names.contains(&info.name) => {
                        dw.vectors.insert(info.name.clone(), v);
                    }
                    other => {
                        dw.matrices.insert(info.name.clone(), other);
                    }
                }
            }
        }
        dw.upload_ple_tables(gpu, program)?;
        gpu.sync("generating random weights")?;
        Ok(dw)
    }

    /// No weights yet.
    pub(super) fn empty() -> DeviceWeights {
        DeviceWeights {
            matrices: HashMap::new(),
            nvfp4: HashMap::new(),
            vectors: HashMap::new(),
            ple: Vec::new(),
            bytes: 0,
        }
    }

    /// Every buffer's contents by weight name, as bytes (tests: two loads compared).
    pub fn contents(
        &self,
        gpu: &Gpu,
    ) -> Result<std::collections::BTreeMap<String, Vec<u8>>, CudaError> {
        let mut out = std::collections::BTreeMap::new();
        let f32_bytes = |v: Vec<f32>| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        for (n, m) in &self.matrices {
            let bytes = match m {
                DeviceMatrix::F32(s) => f32_bytes(gpu.download(s, n)?),
                DeviceMatrix::Bf16(s) => gpu
                    .download(s, n)?
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect(),
            };
            out.insert(n.clone(), bytes);
        }
        for (n, v) in &self.vectors {
            out.insert(n.clone(), f32_bytes(gpu.download(v, n)?));
        }
        for (n, b) in &self.nvfp4 {
            let mut bytes = gpu.download(&b.codes, n)?;
            bytes.extend(gpu.download(&b.scales, n)?);
            bytes.extend(f32_bytes(gpu.download(&b.globals, n)?));
            out.insert(n.clone(), bytes);
        }
        Ok(out)
    }

    pub(super) fn upload_ple_tables(
        &mut self,
        gpu: &Gpu,
        program: &Program,
    ) -> Result<(), CudaError> {
        for t in &program.consts.ple_tables {
            self.ple.push([
                gpu.upload(&t.multipliers, "PLE multipliers")?,
                gpu.upload(&t.head_sizes, "PLE head sizes")?,
                gpu.upload(&t.head_offsets, "PLE head offsets")?,
            ]);
        }
        Ok(())
    }

    pub(super) fn matrix(&self, name: &str) -> Result<&DeviceMatrix, CudaError> {
        self.matrices.get(name).ok_or_else(|| missing(name))
    }

    pub(super) fn nvfp4(&self, name: &str) -> Result<&DeviceNvfp4, CudaError> {
        self.nvfp4.get(name).ok_or_else(|| missing(name))
    }

    pub(super) fn vector(&self, name: &str) -> Result<&CudaSlice<f32>, CudaError> {
        self.vectors.get(name).ok_or_else(|| missing(name))
    }
}

/// The routed experts' banks and the rows of one checkpoint tensor of each (an NVFP4 global's
/// rows: gate/up banks hold an expert's gate tensor, then its up tensor).
fn expert_banks(program: &Program) -> HashMap<String, usize> {
    let mut out = HashMap::new();
    for n in &program.nodes {
        if let crate::ir::Op::MoeExperts { intermediate, .. } = &n.op {
            if let [gate_up, down] = &n.weights[..] {
                out.insert(gate_up.clone(), *intermediate);
                let hidden = program
                    .weights
                    .iter()
                    .find(|w| &w.name == down)
                    .and_then(|w| w.shape.get(1).copied())
                    .unwrap_or(0);
                out.insert(down.clone(), hidden);
            }
        }
    }
    out
}

/// Weights read by the matrix kernels (`Op::weight_is_matrix`).
pub(super) fn matrix_weights(program: &Program) -> std::collections::HashSet<String> {
    program
        .nodes
        .iter()
        .flat_map(|n| {
            n.weights
                .iter()
                .enumerate()
                .filter(|&(i, _)| n.op.weight_is_matrix(i))
                .map(|(_, w)| w.clone())
        })
        .collect()
}

fn missing(name: &str) -> CudaError {
    CudaError::Driver {
        doing: format!("finding weight `{name}` on the device"),
        msg: "not uploaded".into(),
    }
}
