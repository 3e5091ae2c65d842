//! The mutation-fuzzing harness of `tests/fuzz.rs`: deterministic mutators seeded from the
//! repository's real files, a runner that catches panics and times cases, and a cap on single
//! allocations (installed by the test binary as its global allocator).
//!
//! Settings (environment):
//! - `GRAPHRUN_FUZZ_CASES=N`: cases per target (default: each target's short CI count).
//! - `GRAPHRUN_FUZZ_SEED=S`: the base seed (default 0); case `i` of a target is seeded from
//!   (S, target, i), so `GRAPHRUN_FUZZ_FIRST=i GRAPHRUN_FUZZ_CASES=1` replays case `i` alone.
//! - `GRAPHRUN_FUZZ_SLOW_MS=MS`: a case slower than this is reported as slow (default 2000).
//! - `GRAPHRUN_FUZZ_HANG_S=S`: a case running longer aborts the run, naming it (default 300).
//! - `GRAPHRUN_FUZZ_MAX_ALLOC=BYTES`: the largest single allocation allowed (default 256 MiB).
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::{Cell, RefCell};
use std::panic::{self, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

// ---------------------------------------------------------------------------------------------
// The allocation cap
// ---------------------------------------------------------------------------------------------

/// The largest single allocation, in bytes. The tiny models need a few MiB; anything sized from
/// an unchecked 2^31 is at least 2 GiB.
static MAX_ALLOC: AtomicUsize = AtomicUsize::new(DEFAULT_MAX_ALLOC);

const DEFAULT_MAX_ALLOC: usize = 256 << 20;

/// The system allocator, refusing any single request above [`MAX_ALLOC`]. A refused request
/// makes Rust abort with `memory allocation of N bytes failed`: a fuzz case must never size an
/// allocation from a number it has not checked against what the input holds. The progress file
/// (see [`run`]) names the case that did it.
pub struct Capped;

impl Capped {
    fn allows(size: usize) -> bool {
        size <= MAX_ALLOC.load(Ordering::Relaxed)
    }
}

// SAFETY: every call is passed on to `System` unchanged, or refused with a null pointer, which
// is how an allocator reports failure.
unsafe impl GlobalAlloc for Capped {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !Self::allows(layout.size()) {
            return std::ptr::null_mut();
        }
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !Self::allows(layout.size()) {
            return std::ptr::null_mut();
        }
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !Self::allows(new_size) {
            return std::ptr::null_mut();
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

// ---------------------------------------------------------------------------------------------
// Settings
// ---------------------------------------------------------------------------------------------

fn env_u64(name: &str) -> Option<u64> {
    let text = std::env::var(name).ok()?;
    Some(
        text.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={text}: expected a non-negative integer")),
    )
}

pub struct Settings {
    pub cases: usize,
    pub first: usize,
    pub seed: u64,
    pub slow: Duration,
    pub hang: Duration,
}

impl Settings {
    pub fn from_env(default_cases: usize) -> Settings {
        if let Some(cap) = env_u64("GRAPHRUN_FUZZ_MAX_ALLOC") {
            MAX_ALLOC.store(cap as usize, Ordering::Relaxed);
        }
        Settings {
            cases: env_u64("GRAPHRUN_FUZZ_CASES").map_or(default_cases, |n| n as usize),
            first: env_u64("GRAPHRUN_FUZZ_FIRST").unwrap_or(0) as usize,
            seed: env_u64("GRAPHRUN_FUZZ_SEED").unwrap_or(0),
            slow: Duration::from_millis(env_u64("GRAPHRUN_FUZZ_SLOW_MS").unwrap_or(2000)),
            hang: Duration::from_secs(env_u64("GRAPHRUN_FUZZ_HANG_S").unwrap_or(300)),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The runner
// ---------------------------------------------------------------------------------------------

thread_local! {
    static IN_CASE: Cell<bool> = const { Cell::new(false) };
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// A panic inside a case is recorded for the report instead of printed; any other panic (the
/// test's own asserts) prints as usual.
fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if IN_CASE.with(|c| c.get()) {
                LAST_PANIC.with(|p| *p.borrow_mut() = Some(info.to_string()));
            } else {
                default(info);
            }
        }));
    });
}

/// What one case did, apart from panicking.
pub enum Outcome {
    /// The input was accepted (and, for the end-to-end targets, ran).
    Ok,
    /// Refused with an error; the label groups errors for the report (e.g. the error's kind).
    Err(String),
}

/// One generated input: how it was made (to reproduce and to report it) and the input itself.
pub struct Case<T> {
    pub how: Vec<String>,
    pub input: T,
}

struct Finding {
    case: usize,
    how: Vec<String>,
    what: String,
}

/// What a run of one target found.
pub struct Report {
    pub target: &'static str,
    pub cases: usize,
    pub ok: usize,
    pub errors: std::collections::BTreeMap<String, usize>,
    panics: Vec<Finding>,
    slow: Vec<(usize, Duration, Vec<String>)>,
    pub slowest: Duration,
    pub elapsed: Duration,
}

impl Report {
    /// Fails the test when any case panicked, naming the first few with how they were made.
    pub fn assert_clean(&self) {
        eprintln!("{}", self.summary());
        if self.panics.is_empty() {
            return;
        }
        let shown: Vec<String> = self
            .panics
            .iter()
            .take(5)
            .map(|f| {
                format!(
                    "case {} ({}):\n    {}",
                    f.case,
                    f.how.join("; "),
                    f.what.replace('\n', "\n    ")
                )
            })
            .collect();
        panic!(
            "fuzz {}: {} of {} cases panicked; the first:\n{}",
            self.target,
            self.panics.len(),
            self.cases,
            shown.join("\n")
        );
    }

    pub fn summary(&self) -> String {
        let errors: Vec<String> = self
            .errors
            .iter()
            .map(|(label, n)| format!("{n} {label}"))
            .collect();
        let mut text = format!(
            "fuzz {}: {} cases in {:.1} s: {} ok, {} refused ({}), {} panicked; slowest case {} ms",
            self.target,
            self.cases,
            self.elapsed.as_secs_f64(),
            self.ok,
            self.errors.values().sum::<usize>(),
            errors.join(", "),
            self.panics.len(),
            self.slowest.as_millis()
        );
        for (case, t, how) in self.slow.iter().take(5) {
            text.push_str(&format!(
                "\n  slow: case {case} took {} ms ({})",
                t.as_millis(),
                how.join("; ")
            ));
        }
        if self.slow.len() > 5 {
            text.push_str(&format!("\n  ... {} slow cases in all", self.slow.len()));
        }
        text
    }
}

/// The file naming the case in progress, so that an abort (a refused allocation, the hang
/// watchdog) can be traced to its case.
pub fn progress_file(target: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "graphrun-fuzz-{target}-{}.progress",
        std::process::id()
    ))
}

/// A case's generator, seeded from the base seed, the target and the case index.
pub fn case_rng(seed: u64, target: &str, case: usize) -> ChaCha8Rng {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in target.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    ChaCha8Rng::seed_from_u64(h ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ case as u64)
}

/// Runs `settings.cases` cases of a target: `make` builds case `i`'s input from its generator
/// (outside the panic guard: a generator bug is the test's), `exercise` runs it.
pub fn run<T>(
    target: &'static str,
    settings: &Settings,
    mut make: impl FnMut(&mut ChaCha8Rng) -> Case<T>,
    mut exercise: impl FnMut(&T) -> Outcome,
) -> Report {
    install_panic_hook();
    let progress = progress_file(target);
    let started = Instant::now();
    let watch = Watchdog::start(target, settings.hang);
    let mut report = Report {
        target,
        cases: 0,
        ok: 0,
        errors: Default::default(),
        panics: Vec::new(),
        slow: Vec::new(),
        slowest: Duration::ZERO,
        elapsed: Duration::ZERO,
    };
    for i in settings.first..settings.first + settings.cases {
        let mut rng = case_rng(settings.seed, target, i);
        let case = make(&mut rng);
        let note = format!(
            "target {target} case {i} seed {}: {}\n",
            settings.seed,
            case.how.join("; ")
        );
        let _ = std::fs::write(&progress, &note);
        watch.begin(&note);
        IN_CASE.with(|c| c.set(true));
        let t0 = Instant::now();
        let result = panic::catch_unwind(AssertUnwindSafe(|| exercise(&case.input)));
        let took = t0.elapsed();
        IN_CASE.with(|c| c.set(false));
        watch.end();
        report.cases += 1;
        report.slowest = report.slowest.max(took);
        if took > settings.slow {
            report.slow.push((i, took, case.how.clone()));
        }
        match result {
            Ok(Outcome::Ok) => report.ok += 1,
            Ok(Outcome::Err(label)) => *report.errors.entry(label).or_default() += 1,
            Err(_) => report.panics.push(Finding {
                case: i,
                how: case.how,
                what: LAST_PANIC
                    .with(|p| p.borrow_mut().take())
                    .unwrap_or_else(|| "(no panic message)".into()),
            }),
        }
    }
    report.elapsed = started.elapsed();
    let _ = std::fs::remove_file(&progress);
    report
}

/// Aborts the process when one case runs past the hang limit, after printing which one.
struct Watchdog {
    origin: Instant,
    /// Milliseconds since `origin` at which the running case began, plus one; 0 when idle.
    busy_since_ms: Arc<AtomicU64>,
    note: Arc<std::sync::Mutex<String>>,
    done: Arc<AtomicBool>,
}

impl Watchdog {
    fn start(target: &'static str, hang: Duration) -> Watchdog {
        let w = Watchdog {
            origin: Instant::now(),
            busy_since_ms: Arc::new(AtomicU64::new(0)),
            note: Arc::new(std::sync::Mutex::new(String::new())),
            done: Arc::new(AtomicBool::new(false)),
        };
        let (origin, busy, note, done) = (
            w.origin,
            w.busy_since_ms.clone(),
            w.note.clone(),
            w.done.clone(),
        );
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                let since = busy.load(Ordering::Relaxed);
                let now = origin.elapsed().as_millis() as u64 + 1;
                if since > 0 && now.saturating_sub(since) > hang.as_millis() as u64 {
                    eprintln!(
                        "fuzz {target}: a case ran past {} s (hang): {}",
                        hang.as_secs(),
                        note.lock().map(|n| n.clone()).unwrap_or_default()
                    );
                    std::process::abort();
                }
            }
        });
        w
    }

    fn begin(&self, note: &str) {
        if let Ok(mut n) = self.note.lock() {
            n.clear();
            n.push_str(note);
        }
        let now = self.origin.elapsed().as_millis() as u64 + 1;
        self.busy_since_ms.store(now, Ordering::Relaxed);
    }

    fn end(&self) {
        self.busy_since_ms.store(0, Ordering::Relaxed);
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
    }
}

// ---------------------------------------------------------------------------------------------
// Mutators
// ---------------------------------------------------------------------------------------------

/// Numbers that break size arithmetic: limits of i32/u32/i64/u64 and f64, negatives, zero, one,
/// fractions, and numbers too long for any integer type.
pub const NUMBERS: [&str; 24] = [
    "0",
    "1",
    "2",
    "-1",
    "3",
    "513",
    "65536",
    "65537",
    "2147483647",
    "2147483648",
    "4294967295",
    "4294967296",
    "9007199254740993",
    "9223372036854775807",
    "9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775808",
    "99999999999999999999999999999",
    "1e308",
    "-1e308",
    "1e-308",
    "1.5",
    "0.0",
];

/// One of [`NUMBERS`].
pub fn number(rng: &mut ChaCha8Rng) -> &'static str {
    NUMBERS[rng.random_range(0..NUMBERS.len())]
}

/// One of [`NUMBERS`] as a JSON value (the long ones become floats, as serde_json reads them).
pub fn number_value(rng: &mut ChaCha8Rng) -> Value {
    serde_json::from_str(number(rng)).expect("every entry is a JSON number")
}

/// Bytes that matter to JSON and RON syntax.
const SYNTAX: &[u8] = b"{}[](),:\"'\\-+.0123456789eE \n#/*_";

fn pick<'a, T>(rng: &mut ChaCha8Rng, items: &'a [T]) -> &'a T {
    &items[rng.random_range(0..items.len())]
}

/// Spans `[start, end)` of maximal runs of bytes for which `inside` holds, starting where
/// `starts` holds.
fn spans(
    text: &[u8],
    starts: impl Fn(u8) -> bool,
    inside: impl Fn(u8) -> bool,
) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < text.len() {
        if starts(text[i]) {
            let s = i;
            i += 1;
            while i < text.len() && inside(text[i]) {
                i += 1;
            }
            out.push((s, i));
        } else {
            i += 1;
        }
    }
    out
}

fn number_spans(text: &[u8]) -> Vec<(usize, usize)> {
    spans(
        text,
        |b| b.is_ascii_digit() || b == b'-',
        |b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'),
    )
}

fn word_spans(text: &[u8]) -> Vec<(usize, usize)> {
    spans(
        text,
        |b| b.is_ascii_alphabetic() || b == b'_',
        |b| b.is_ascii_alphanumeric() || b == b'_',
    )
}

/// Quoted strings, quotes included (escapes are not interpreted: a mutation may split one).
fn string_spans(text: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut open = None;
    for (i, &b) in text.iter().enumerate() {
        if b == b'"' {
            match open.take() {
                None => open = Some(i),
                Some(s) => out.push((s, i + 1)),
            }
        }
    }
    out
}

/// Replaces span `a` by `with`.
fn splice(text: &mut Vec<u8>, (s, e): (usize, usize), with: &[u8]) {
    text.splice(s..e, with.iter().copied());
}

/// Swaps the contents of two non-overlapping spans.
fn swap_spans(text: &mut Vec<u8>, a: (usize, usize), b: (usize, usize)) {
    let (first, second) = if a.0 < b.0 { (a, b) } else { (b, a) };
    if first.1 > second.0 {
        return;
    }
    let x = text[first.0..first.1].to_vec();
    let y = text[second.0..second.1].to_vec();
    splice(text, second, &x);
    splice(text, first, &y);
}

/// Applies one random text-level mutation to `text`, returning what it did. Aware of numbers,
/// words and quoted strings (JSON and RON alike), so that most mutants still parse as far as the
/// part that was changed.
pub fn mutate_text(rng: &mut ChaCha8Rng, text: &mut Vec<u8>) -> String {
    if text.is_empty() {
        text.push(*pick(rng, SYNTAX));
        return "inserted one byte into an empty input".into();
    }
    let len = text.len();
    let at = rng.random_range(0..len);
    match rng.random_range(0..14) {
        0 => {
            let bit = rng.random_range(0..8);
            text[at] ^= 1 << bit;
            format!("flipped bit {bit} of byte {at}")
        }
        1 => {
            let b = *pick(rng, SYNTAX);
            text[at] = b;
            format!("set byte {at} to {:?}", b as char)
        }
        2 => {
            let n = rng.random_range(1..=16.min(len - at));
            text.drain(at..at + n);
            format!("deleted {n} bytes at {at}")
        }
        3 => {
            let n = rng.random_range(1..=64.min(len - at));
            let copy = text[at..at + n].to_vec();
            let to = rng.random_range(0..=text.len());
            text.splice(to..to, copy);
            format!("copied {n} bytes from {at} to {to}")
        }
        4 => {
            text.truncate(at);
            format!("truncated to {at} bytes")
        }
        5 => {
            let s = number(rng);
            text.splice(at..at, s.bytes());
            format!("inserted {s} at {at}")
        }
        6..=8 => {
            let spans = number_spans(text);
            if spans.is_empty() {
                return mutate_text(rng, text);
            }
            let span = *pick(rng, &spans);
            let s = number(rng);
            let old = String::from_utf8_lossy(&text[span.0..span.1]).to_string();
            splice(text, span, s.as_bytes());
            format!("replaced the number {old} at {} by {s}", span.0)
        }
        9 => {
            let spans = number_spans(text);
            if spans.len() < 2 {
                return mutate_text(rng, text);
            }
            let (a, b) = (*pick(rng, &spans), *pick(rng, &spans));
            swap_spans(text, a, b);
            format!("swapped the numbers at {} and {}", a.0, b.0)
        }
        10..=11 => {
            let spans = string_spans(text);
            let spans = if spans.len() < 2 {
                word_spans(text)
            } else {
                spans
            };
            if spans.len() < 2 {
                return mutate_text(rng, text);
            }
            let (a, b) = (*pick(rng, &spans), *pick(rng, &spans));
            swap_spans(text, a, b);
            format!("swapped the strings at {} and {}", a.0, b.0)
        }
        12 => {
            let spans = word_spans(text);
            if spans.len() < 2 {
                return mutate_text(rng, text);
            }
            let (a, b) = (*pick(rng, &spans), *pick(rng, &spans));
            let word = text[b.0..b.1].to_vec();
            let old = String::from_utf8_lossy(&text[a.0..a.1]).to_string();
            splice(text, a, &word);
            format!(
                "replaced the word {old} at {} by {}",
                a.0,
                String::from_utf8_lossy(&word)
            )
        }
        _ => {
            // A whole line dropped or repeated.
            let starts: Vec<usize> = std::iter::once(0)
                .chain(
                    text.iter()
                        .enumerate()
                        .filter(|(_, &b)| b == b'\n')
                        .map(|(i, _)| i + 1),
                )
                .filter(|&i| i < len)
                .collect();
            let s = *pick(rng, &starts);
            let e = text[s..]
                .iter()
                .position(|&b| b == b'\n')
                .map_or(len, |p| s + p + 1);
            if rng.random_bool(0.5) {
                text.drain(s..e);
                format!("deleted the line at {s}")
            } else {
                let line = text[s..e].to_vec();
                text.splice(s..s, line);
                format!("repeated the line at {s}")
            }
        }
    }
}

/// Every path (object keys and array indices) in `v`, the root included.
pub fn json_paths(v: &Value) -> Vec<Vec<PathStep>> {
    fn walk(v: &Value, at: &mut Vec<PathStep>, out: &mut Vec<Vec<PathStep>>) {
        out.push(at.clone());
        match v {
            Value::Object(m) => {
                for (k, child) in m {
                    at.push(PathStep::Key(k.clone()));
                    walk(child, at, out);
                    at.pop();
                }
            }
            Value::Array(a) => {
                for (i, child) in a.iter().enumerate() {
                    at.push(PathStep::Index(i));
                    walk(child, at, out);
                    at.pop();
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(v, &mut Vec::new(), &mut out);
    out
}

#[derive(Debug, Clone, PartialEq)]
pub enum PathStep {
    Key(String),
    Index(usize),
}

pub fn show_path(path: &[PathStep]) -> String {
    if path.is_empty() {
        return "(root)".into();
    }
    path.iter()
        .map(|s| match s {
            PathStep::Key(k) => k.clone(),
            PathStep::Index(i) => format!("[{i}]"),
        })
        .collect::<Vec<_>>()
        .join(".")
}

pub fn at_path<'a>(v: &'a mut Value, path: &[PathStep]) -> Option<&'a mut Value> {
    let mut cur = v;
    for step in path {
        cur = match step {
            PathStep::Key(k) => cur.as_object_mut()?.get_mut(k)?,
            PathStep::Index(i) => cur.as_array_mut()?.get_mut(*i)?,
        };
    }
    Some(cur)
}

/// A replacement for a JSON value: mostly numbers from [`NUMBERS`], sometimes another type.
pub fn odd_value(rng: &mut ChaCha8Rng) -> Value {
    match rng.random_range(0..10) {
        0 => Value::Null,
        1 => Value::Bool(rng.random_bool(0.5)),
        2 => Value::String(
            pick(rng, &["", "x", "F32", "I64", "linear_attention", "silu"]).to_string(),
        ),
        3 => Value::Array(vec![number_value(rng); rng.random_range(0..4)]),
        4 => Value::Object(Default::default()),
        _ => number_value(rng),
    }
}

/// Applies one structural mutation to a JSON document: a value replaced (mostly by a number
/// from [`NUMBERS`]), a key removed or renamed, an array emptied, cut or grown.
pub fn mutate_json(rng: &mut ChaCha8Rng, root: &mut Value) -> String {
    let paths = json_paths(root);
    let path = pick(rng, &paths).clone();
    let shown = show_path(&path);
    let Some(target) = at_path(root, &path) else {
        return "no-op".into();
    };
    match rng.random_range(0..8) {
        0..=3 => {
            let v = if target.is_number() || rng.random_bool(0.3) {
                number_value(rng)
            } else {
                odd_value(rng)
            };
            let text = format!("set {shown} to {v}");
            *target = v;
            text
        }
        4 => match target {
            Value::Object(m) if !m.is_empty() => {
                let keys: Vec<String> = m.keys().cloned().collect();
                let k = pick(rng, &keys).clone();
                m.remove(&k);
                format!("removed {shown}.{k}")
            }
            _ => {
                *target = odd_value(rng);
                format!("replaced {shown} by an odd value")
            }
        },
        5 => match target {
            Value::Object(m) if m.len() >= 2 => {
                // Two keys trade values: a value lands in a field of another type or meaning.
                let keys: Vec<String> = m.keys().cloned().collect();
                let (a, b) = (pick(rng, &keys).clone(), pick(rng, &keys).clone());
                let va = m.get(&a).cloned().unwrap_or(Value::Null);
                let vb = m.get(&b).cloned().unwrap_or(Value::Null);
                m.insert(a.clone(), vb);
                m.insert(b.clone(), va);
                format!("swapped {shown}.{a} and {shown}.{b}")
            }
            _ => {
                *target = number_value(rng);
                format!("set {shown} to a number")
            }
        },
        6 => match target {
            Value::Array(a) if !a.is_empty() => {
                let n = rng.random_range(0..a.len());
                a.truncate(n);
                format!("cut {shown} to {n} entries")
            }
            _ => {
                *target = Value::Array(Vec::new());
                format!("set {shown} to []")
            }
        },
        _ => match target {
            Value::Array(a) if !a.is_empty() => {
                let extra = rng.random_range(1..=64);
                let last = a[a.len() - 1].clone();
                a.extend(std::iter::repeat_n(last, extra));
                format!("grew {shown} by {extra} entries")
            }
            Value::Object(m) => {
                let key = pick(
                    rng,
                    &["", "__metadata__", "dtype", "shape", "data_offsets", "x"],
                )
                .to_string();
                let v = odd_value(rng);
                let text = format!("added {shown}.{key:?} = {v}");
                m.insert(key, v);
                text
            }
            _ => {
                *target = odd_value(rng);
                format!("replaced {shown} by an odd value")
            }
        },
    }
}
