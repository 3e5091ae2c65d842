//! A model's weights on the device: uploaded once, matrices in their stored format.

use super::*;
use crate::registry::Placement;
use crate::weights::{HostTable, TableElement};

/// A model's weights on the device.
pub struct DeviceWeights {
    pub(super) matrices: HashMap<String, DeviceMatrix>,
    /// NVFP4 expert banks, packed as the checkpoint stores them.
    pub(super) nvfp4: HashMap<String, DeviceNvfp4>,
    pub(super) vectors: HashMap<String, CudaSlice<f32>>,
    /// PLE hash tables per table index: multipliers, sizes, offsets.
    pub(super) ple: Vec<[CudaSlice<i64>; 3]>,
    /// Tables kept in host memory (the PLE n-gram table, where the program gathers it on the
    /// host), by weight name; not counted in `bytes`.
    pub(super) host_tables: HashMap<String, HostTable>,
    pub bytes: usize,
}

impl DeviceWeights {
    /// Uploads every weight `program` uses: NVFP4 banks as stored, other matrices as bf16 when
    /// `bf16` (exact when the checkpoint was bf16: the host copies are its values widened), the
    /// PLE n-gram tables kept on the host when `ple_table` says so.
    pub fn upload(
        gpu: &Gpu,
        program: &Program,
        weights: &Weights,
        bf16: bool,
        ple_table: Placement,
    ) -> Result<DeviceWeights, CudaError> {
        let mut dw = DeviceWeights::empty();
        let keeping = Keeping::new(program, bf16, ple_table);
        for info in program
            .weights
            .iter()
            .filter(|w| w.class == WeightClass::Float)
        {
            let name = info.name.as_str();
            if let Some(bank) = weights.nvfp4(name) {
                let m = DeviceNvfp4::upload(gpu, bank, name)?;
                dw.bytes += m.bytes();
                dw.nvfp4.insert(info.name.clone(), m);
                continue;
            }
            let Some(t) = weights.get(name) else {
                continue;
            };
            match keeping.of(name, false) {
                Keep::HostTable { bf16 } => {
                    let width = t.shape.get(1).copied().unwrap_or(1);
                    let element = table_element(bf16);
                    let table = HostTable::from_f32(name, width, element, &t.data);
                    dw.host_tables.insert(info.name.clone(), table);
                }
                Keep::Matrix { bf16: true } => {
                    let bits: Vec<u16> = t
                        .data
                        .iter()
                        .map(|&v| half::bf16::from_f32(v).to_bits())
                        .collect();
                    dw.bytes += bits.len() * 2;
                    let m = DeviceMatrix::Bf16(gpu.upload(&bits, name)?);
                    dw.matrices.insert(info.name.clone(), m);
                }
                Keep::Matrix { bf16: false } => {
                    dw.bytes += t.data.len() * 4;
                    let m = DeviceMatrix::F32(gpu.upload(&t.data, name)?);
                    dw.matrices.insert(info.name.clone(), m);
                }
                Keep::Nvfp4 => unreachable!("asked for a weight that is not an NVFP4 bank"),
                Keep::Vector => {
                    dw.bytes += t.data.len() * 4;
                    dw.vectors
                        .insert(info.name.clone(), gpu.upload(&t.data, name)?);
                }
            }
        }
        dw.upload_ple_tables(gpu, program)?;
        Ok(dw)
    }

    /// Random weights generated on the device (benchmarks at the real geometry, no files):
    /// matrices uniform with the variance of N(0, 1/fan_in), (1+w) norms near 0, plain norms and
    /// dt_bias near 1, A_log in [0, ln 16], embeddings uniform in [-1, 1); the routed experts
    /// as NVFP4 banks with `nvfp4_experts` (`DeviceNvfp4::random`); a table kept on the host
    /// (`ple_table`) is zeros of its real size, which take host memory only where read.
    pub fn random(
        gpu: &Gpu,
        program: &Program,
        bf16: bool,
        nvfp4_experts: bool,
        ple_table: Placement,
        seed: u64,
    ) -> Result<DeviceWeights, CudaError> {
        let experts = expert_banks(program);
        let mut dw = DeviceWeights::empty();
        let keeping = Keeping::new(program, bf16, ple_table);
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
            let rows_per_global = experts.get(name).filter(|_| nvfp4_experts);
            match (keeping.of(name, rows_per_global.is_some()), &info.shape[..]) {
                (Keep::HostTable { bf16 }, [rows, width]) => {
                    let table = HostTable::zeros(name, *rows, *width, table_element(bf16))
                        .map_err(|e| CudaError::Driver {
                            doing: format!("mapping host memory for `{name}`"),
                            msg: e.to_string(),
                        })?;
                    dw.host_tables.insert(info.name.clone(), table);
                }
                (Keep::Nvfp4, [e, out, inputs]) => {
                    let rows_per_global = *rows_per_global.expect("an expert bank");
                    let cx = Launch::new(gpu);
                    let shape = [*e, *out, *inputs];
                    let m = DeviceNvfp4::random(&cx, shape, rows_per_global, seed_i, name)?;
                    dw.bytes += m.bytes();
                    dw.nvfp4.insert(info.name.clone(), m);
                }
                (Keep::Matrix { bf16: true }, _) => {
                    let mut m = DeviceMatrix::Bf16(gpu.zeros::<u16>(n, name)?);
                    launch::fill_uniform(&Launch::new(gpu), &mut m, seed_i, lo, hi)?;
                    dw.bytes += n * 2;
                    dw.matrices.insert(info.name.clone(), m);
                }
                (keep, _) => {
                    let mut m = DeviceMatrix::F32(gpu.zeros::<f32>(n, name)?);
                    launch::fill_uniform(&Launch::new(gpu), &mut m, seed_i, lo, hi)?;
                    dw.bytes += n * 4;
                    match m {
                        DeviceMatrix::F32(v) if keep == Keep::Vector => {
                            dw.vectors.insert(info.name.clone(), v);
                        }
                        other => {
                            dw.matrices.insert(info.name.clone(), other);
                        }
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
            host_tables: HashMap::new(),
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

    pub(super) fn host_table(&self, name: &str) -> Result<&HostTable, CudaError> {
        self.host_tables.get(name).ok_or_else(|| missing(name))
    }

    /// The host tables, by weight name.
    pub fn host_tables(&self) -> impl Iterator<Item = &HostTable> {
        self.host_tables.values()
    }

    pub(super) fn vector(&self, name: &str) -> Result<&CudaSlice<f32>, CudaError> {
        self.vectors.get(name).ok_or_else(|| missing(name))
    }
}

/// The routed experts' banks and the rows of one checkpoint tensor of each (an NVFP4 global's
/// rows: gate/up banks hold an expert's gate tensor, then its up tensor).
pub(super) fn expert_banks(program: &Program) -> HashMap<String, usize> {
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

/// How the device keeps one weight of a program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Keep {
    /// An NVFP4 bank, packed as stored.
    Nvfp4,
    /// A matrix in bf16 (of a bf16 checkpoint) or f32.
    Matrix { bf16: bool },
    /// An f32 vector (norms, biases...).
    Vector,
    /// A table in host memory (`HostTable`), its rows gathered there.
    HostTable { bf16: bool },
}

impl Keep {
    /// Device bytes of a weight of `elements` values from `tensors` checkpoint tensors.
    pub(super) fn device_bytes(self, elements: usize, tensors: usize) -> usize {
        match self {
            Keep::Nvfp4 => elements / 2 + elements / crate::quant::nvfp4::GROUP + 4 * tensors,
            Keep::Matrix { bf16: true } => 2 * elements,
            Keep::Matrix { bf16: false } | Keep::Vector => 4 * elements,
            Keep::HostTable { .. } => 0,
        }
    }
}

/// What decides [`Keep`] for every weight of a program: one place for the upload, the random
/// weights, the load from files and the memory plan.
pub(super) struct Keeping {
    matrices: std::collections::HashSet<String>,
    on_host: std::collections::HashSet<String>,
    bf16: bool,
}

impl Keeping {
    /// Matrices (weights the matrix kernels read: `Op::weight_is_matrix`) as bf16 when `bf16`;
    /// the PLE n-gram tables on the host when `ple_table` says so.
    pub(super) fn new(program: &Program, bf16: bool, ple_table: Placement) -> Keeping {
        let mut matrices = std::collections::HashSet::new();
        let mut on_host = std::collections::HashSet::new();
        for n in &program.nodes {
            for (i, w) in n.weights.iter().enumerate() {
                if n.op.weight_is_matrix(i) {
                    matrices.insert(w.clone());
                }
            }
            if ple_table == Placement::Host && crate::registry::reads_ple_table(program, n) {
                on_host.extend(n.weights.first().cloned());
            }
        }
        Keeping {
            matrices,
            on_host,
            bf16,
        }
    }

    /// How weight `name` is kept (`nvfp4`: the checkpoint stores it as NVFP4 matrices).
    pub(super) fn of(&self, name: &str, nvfp4: bool) -> Keep {
        if self.on_host.contains(name) {
            Keep::HostTable { bf16: self.bf16 }
        } else if nvfp4 {
            Keep::Nvfp4
        } else if self.matrices.contains(name) {
            Keep::Matrix { bf16: self.bf16 }
        } else {
            Keep::Vector
        }
    }

    pub(super) fn on_host(&self, name: &str) -> bool {
        self.on_host.contains(name)
    }
}

/// The element type a host table keeps (a bf16 checkpoint's bits, else f32).
pub(super) fn table_element(bf16: bool) -> TableElement {
    if bf16 {
        TableElement::Bf16
    } else {
        TableElement::F32
    }
}

fn missing(name: &str) -> CudaError {
    CudaError::Driver {
        doing: format!("finding weight `{name}` on the device"),
        msg: "not uploaded".into(),
    }
}
