//! Helpers shared by the GPU tests (`tests/gpu_*.rs`): the device or a note that the tests run
//! elsewhere, random inputs, bf16 rounding, and the error measures every kernel check uses.

use std::io::Write;

use graphrun::exec::cuda::{probe, Gpu};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// f32 math: ‖gpu − cpu‖ / ‖cpu‖ within this, and max |diff| / max |cpu| within ten times it.
pub const F32_BOUND: f64 = 1e-5;

/// The GPU, or None after saying that the calling test is skipped ([`say_skipped`]).
pub fn gpu_or_skip() -> Option<Gpu> {
    cuda_or_skip().then(|| Gpu::new(0).expect("a CUDA device was probed but could not be opened"))
}

/// Whether a CUDA device is present; if not, says that the calling test is skipped.
pub fn cuda_or_skip() -> bool {
    match probe() {
        Ok(_) => true,
        Err(e) => {
            say_skipped(&format!("no CUDA device ({e})"));
            false
        }
    }
}

/// One line on the process's stderr naming the calling test as skipped. Written to the stream
/// itself: the harness captures `println!` and `eprintln!` and drops a passing test's output,
/// so CI would never see them. The harness names each test's thread after the test.
pub fn say_skipped(why: &str) {
    say_skipped_for(
        why,
        "GPU tests run on the GPU machine: scripts/gpu_tests.sh, logs in results/",
    );
}

/// [`say_skipped`] with `how`, where the test does run, in place of the GPU tests' note.
pub fn say_skipped_for(why: &str, how: &str) {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("a GPU test");
    let line = format!("SKIPPED {test}: {why}; {how}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// Uniform in [-1, 1).
pub fn random(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    random_scaled(rng, n, 1.0)
}

/// Uniform in [-scale, scale).
pub fn random_scaled(rng: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| rng.random_range(-1.0f32..1.0) * scale)
        .collect()
}

/// bf16 bits of each value, rounded to nearest even.
pub fn bf16_bits(v: &[f32]) -> Vec<u16> {
    v.iter()
        .map(|&x| half::bf16::from_f32(x).to_bits())
        .collect()
}

/// bf16 bits widened to f32 (exact).
pub fn widen(bits: &[u16]) -> Vec<f32> {
    bits.iter()
        .map(|&b| half::bf16::from_bits(b).to_f32())
        .collect()
}

/// (‖a − b‖ / ‖b‖, max |a − b| / max |b|); a non-finite output fails.
pub fn errors(got: &[f32], want: &[f32]) -> (f64, f64) {
    assert_eq!(got.len(), want.len());
    let (mut num, mut den, mut max_diff, mut max_ref) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        assert!(g.is_finite(), "non-finite output");
        let d = (g - w) as f64;
        num += d * d;
        den += (w as f64) * (w as f64);
        max_diff = max_diff.max(d.abs());
        max_ref = max_ref.max((w as f64).abs());
    }
    (
        (num / den.max(1e-300)).sqrt(),
        max_diff / max_ref.max(1e-300),
    )
}

/// Prints one check's line (with the share of bit-equal values) and asserts the f32 bound.
pub fn check(kernel: &str, shape: &str, got: &[f32], want: &[f32]) -> String {
    let (rel, max) = errors(got, want);
    let exact = got
        .iter()
        .zip(want)
        .filter(|(g, w)| g.to_bits() == w.to_bits())
        .count();
    let line = format!(
        "{kernel:<30} {shape:<40} rel {rel:.2e}  max {max:.2e}  bit-equal {:.1}%",
        100.0 * exact as f64 / want.len().max(1) as f64
    );
    println!("{line}");
    assert!(
        rel <= F32_BOUND && max <= F32_BOUND * 10.0,
        "{kernel} at {shape}: rel {rel:e}, max {max:e}"
    );
    line
}

/// Each value's bits (for bit-for-bit comparisons).
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The lines of a run's checks.
pub struct Report(pub Vec<String>);

impl Report {
    pub fn check(&mut self, kernel: &str, shape: &str, got: &[f32], want: &[f32]) {
        self.0.push(check(kernel, shape, got, want));
    }

    /// Bit-for-bit equality (the same computation, split differently).
    pub fn same(&mut self, kernel: &str, shape: &str, got: &[f32], want: &[f32]) {
        assert_eq!(got.len(), want.len(), "{kernel} at {shape}");
        let differing = got
            .iter()
            .zip(want)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        let line = format!("{kernel:<30} {shape:<40} split == whole: {differing} values differ");
        println!("{line}");
        self.0.push(line);
        assert_eq!(differing, 0, "{kernel} at {shape}: split != whole");
    }
}
