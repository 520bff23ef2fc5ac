//! The trace sampler of `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG`, as
//! the OpenTelemetry specification defines them, decided once per trace: a
//! request and all of its work are kept or dropped together, and so is a
//! loop iteration or an operation outside requests (each its own trace).
//!
//! `traceidratio` is a pure function of the trace id (its 56 low bits
//! against a threshold, as the specification's TraceIdRatioBased with W3C
//! random trace ids), so every span of a trace gets the same answer
//! wherever it is asked.

use anyhow::{anyhow, bail, Result};
use opentelemetry::trace::TraceId;

/// What decides a trace that has no parent (or whose parent is ignored).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Root {
    AlwaysOn,
    AlwaysOff,
    /// Kept when the trace id's 56 low bits are at least this.
    Ratio {
        ratio: f64,
        threshold: u64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampler {
    pub root: Root,
    /// A remote parent's sampled flag decides (the `parentbased_*` samplers).
    pub parent_based: bool,
}

impl Default for Sampler {
    /// The specification's default: `parentbased_always_on`.
    fn default() -> Self {
        Sampler { root: Root::AlwaysOn, parent_based: true }
    }
}

const RANDOM_BITS: u32 = 56;

impl Root {
    fn ratio(r: f64) -> Root {
        let r = r.clamp(0.0, 1.0);
        let span = (1u64 << RANDOM_BITS) as f64;
        Root::Ratio { ratio: r, threshold: ((1.0 - r) * span).round() as u64 }
    }

    fn keeps(self, trace: TraceId) -> bool {
        match self {
            Root::AlwaysOn => true,
            Root::AlwaysOff => false,
            Root::Ratio { threshold, .. } => {
                let random = u128::from_be_bytes(trace.to_bytes()) as u64 & ((1u64 << RANDOM_BITS) - 1);
                random >= threshold
            }
        }
    }
}

/// A cause's bit (`CAUSE_DROP`, bpf/uvspan.h): the kernel decided its trace
/// is not sampled, and sends no record of its fs and DNS work.
pub const CAUSE_DROP: u64 = crate::kernel::skel::types::cause_kind::CAUSE_DROP.0 as u64;

/// The sampler's random number for a trace that starts with `cause`: 56
/// bits, splitmix64's finalizer of the cause without [`CAUSE_DROP`], as the
/// kernel computes it (`cause_random`, bpf/ops.h).
pub fn cause_random(cause: u64) -> u64 {
    let mut z = (cause & !CAUSE_DROP).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) & ((1u64 << RANDOM_BITS) - 1)
}

/// A trace id for a trace that starts with `cause`: `random`'s upper bits
/// and the cause's random number as its 56 low bits, so a trace-id ratio
/// decides it as the kernel did.
pub fn trace_for_cause(random: TraceId, cause: u64) -> TraceId {
    let mask = (1u128 << RANDOM_BITS) - 1;
    let id = (u128::from_be_bytes(random.to_bytes()) & !mask) | u128::from(cause_random(cause));
    // Never the invalid id (all zero): a low part of zero gets a high bit.
    TraceId::from(if id == 0 { 1u128 << 127 } else { id })
}

/// `--publish-trace-context`: a request's trace id and SERVER span id as a
/// function of its cause and this run's random key, the same the kernel
/// writes for profilers at the request's head (`ctx_ids`, bpf/ops.h), so the
/// ids a profile carries are those of the spans exported. The trace id's 56
/// low bits are the cause's random number ([`cause_random`]), as
/// [`trace_for_cause`] gives them: a trace-id ratio decides it as the kernel
/// did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextKey(pub [u64; 2]);

fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl ContextKey {
    fn high(self, cause: u64) -> u64 {
        splitmix((cause & !CAUSE_DROP) ^ self.0[0])
    }

    /// The trace id of a request (without a traceparent) begun as `cause`.
    pub fn trace_id(self, cause: u64) -> TraceId {
        let c = cause & !CAUSE_DROP;
        let mask = (1u64 << RANDOM_BITS) - 1;
        let low = (splitmix(c ^ self.0[1]) & !mask) | cause_random(c);
        TraceId::from((u128::from(self.high(cause)) << 64) | u128::from(low))
    }

    /// The SERVER span id of the request begun as `cause`.
    pub fn span_id(self, cause: u64) -> opentelemetry::trace::SpanId {
        let s = splitmix(self.high(cause) ^ self.0[1]);
        opentelemetry::trace::SpanId::from(if s == 0 { 1 } else { s })
    }
}

impl Sampler {
    /// The kernel's threshold on a trace's 56 random bits (`ksample_threshold`,
    /// bpf/common.h): kept when at least this; `1 << 56` keeps none.
    pub fn kernel_threshold(&self) -> u64 {
        match self.root {
            Root::AlwaysOn => 0,
            Root::AlwaysOff => 1u64 << RANDOM_BITS,
            Root::Ratio { threshold, .. } => threshold,
        }
    }

    /// Whether a trace id's low bits take part in the decision (a ratio
    /// sampler): only then are trace ids made from their cause.
    pub fn by_trace_id(&self) -> bool {
        matches!(self.root, Root::Ratio { .. })
    }

    /// `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG` (unset: the default).
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>) -> Result<Sampler> {
        let name = env("OTEL_TRACES_SAMPLER").map(|v| v.trim().to_ascii_lowercase()).filter(|v| !v.is_empty());
        let arg = env("OTEL_TRACES_SAMPLER_ARG").map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        let ratio = || -> Result<Root> {
            let Some(a) = &arg else { return Ok(Root::ratio(1.0)) };
            let r: f64 = a.parse().map_err(|_| anyhow!("OTEL_TRACES_SAMPLER_ARG={a:?}: give a ratio from 0 to 1, like 0.25"))?;
            if !(0.0..=1.0).contains(&r) {
                bail!("OTEL_TRACES_SAMPLER_ARG={a}: a ratio is from 0 to 1");
            }
            Ok(Root::ratio(r))
        };
        let (root, parent_based) = match name.as_deref() {
            None | Some("parentbased_always_on") => (Root::AlwaysOn, true),
            Some("always_on") => (Root::AlwaysOn, false),
            Some("always_off") => (Root::AlwaysOff, false),
            Some("traceidratio") => (ratio()?, false),
            Some("parentbased_always_off") => (Root::AlwaysOff, true),
            Some("parentbased_traceidratio") => (ratio()?, true),
            Some(other) => bail!(
                "OTEL_TRACES_SAMPLER={other:?} is not supported: use always_on, always_off, traceidratio, \
                 parentbased_always_on, parentbased_always_off or parentbased_traceidratio"
            ),
        };
        Ok(Sampler { root, parent_based })
    }

    /// Whether the trace is kept. `parent`: a remote parent's sampled flag
    /// (None: uvspan starts the trace).
    pub fn keeps(&self, parent: Option<bool>, trace: TraceId) -> bool {
        match parent {
            Some(flag) if self.parent_based => flag,
            _ => self.root.keeps(trace),
        }
    }

    /// Keeps everything (no trace is ever dropped).
    pub fn keeps_all(&self) -> bool {
        self.root == Root::AlwaysOn && !self.parent_based
    }

    /// As the specification names it, with its argument.
    pub fn describe(&self) -> String {
        let root = match self.root {
            Root::AlwaysOn => "always_on".to_string(),
            Root::AlwaysOff => "always_off".to_string(),
            Root::Ratio { ratio, .. } => format!("traceidratio {ratio}"),
        };
        if self.parent_based {
            format!("parentbased_{root}")
        } else {
            root
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(vars: &[(&str, &str)]) -> Result<Sampler> {
        let v: Vec<(String, String)> = vars.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
        Sampler::from_env(&move |k| v.iter().find(|(a, _)| a == k).map(|(_, b)| b.clone()))
    }

    fn trace(low56: u64, high: u64) -> TraceId {
        TraceId::from((u128::from(high) << 64) | u128::from(low56))
    }

    #[test]
    fn every_standard_sampler_with_and_without_a_parent() {
        let t = trace(1 << 55, 7); // the middle of the random range
                                   // (sampler, arg) → (root, parent sampled, parent not sampled)
        let table = [
            ("", "", [true, true, false]),
            ("always_on", "", [true, true, true]),
            ("always_off", "", [false, false, false]),
            ("traceidratio", "0.25", [false, false, false]),
            ("traceidratio", "0.75", [true, true, true]),
            ("parentbased_always_on", "", [true, true, false]),
            ("parentbased_always_off", "", [false, true, false]),
            ("parentbased_traceidratio", "0.25", [false, true, false]),
            ("parentbased_traceidratio", "0.75", [true, true, false]),
        ];
        for (name, arg, want) in table {
            let s = from(&[("OTEL_TRACES_SAMPLER", name), ("OTEL_TRACES_SAMPLER_ARG", arg)]).unwrap();
            let got = [s.keeps(None, t), s.keeps(Some(true), t), s.keeps(Some(false), t)];
            assert_eq!(got, want, "{name} {arg}");
        }
    }

    #[test]
    fn ratio_keeps_its_share_of_random_trace_ids_and_ignores_the_high_bits() {
        let s = from(&[("OTEL_TRACES_SAMPLER", "traceidratio"), ("OTEL_TRACES_SAMPLER_ARG", "0.1")]).unwrap();
        // A simple generator of 64-bit randoms (xorshift), 100,000 ids.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let kept = (0..100_000)
            .filter(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                s.keeps(None, trace(x >> 8, 0))
            })
            .count();
        assert!((9_400..=10_600).contains(&kept), "{kept} of 100000 at 0.1");
        assert_eq!(s.keeps(None, trace(5, 1)), s.keeps(None, trace(5, 99)), "the high bits do not decide");
        let all = from(&[("OTEL_TRACES_SAMPLER", "traceidratio"), ("OTEL_TRACES_SAMPLER_ARG", "1")]).unwrap();
        assert!(all.keeps(None, trace(0, 0)));
        let none = from(&[("OTEL_TRACES_SAMPLER", "traceidratio"), ("OTEL_TRACES_SAMPLER_ARG", "0")]).unwrap();
        assert!(!none.keeps(None, trace((1 << 56) - 1, 0)));
    }

    #[test]
    fn trace_ids_made_from_causes_are_decided_as_the_kernel_decides_them() {
        // splitmix64's finalizer (golden values: the kernel computes the same).
        assert_eq!(cause_random(0), 0xe220_a839_7b1d_cdaf & ((1 << 56) - 1));
        assert_eq!(cause_random(1 << 8), cause_random((1 << 8) | CAUSE_DROP), "the drop bit is not part of it");
        let s = from(&[("OTEL_TRACES_SAMPLER", "traceidratio"), ("OTEL_TRACES_SAMPLER_ARG", "0.1")]).unwrap();
        // Causes of requests 1 µs apart on 2 CPUs (near-sequential inputs).
        let causes: Vec<u64> = (0..100_000u64).map(|i| ((1_000_000_000 + i * 1_000) << 8) | (i % 2)).collect();
        let kept = causes.iter().filter(|&&c| cause_random(c) >= s.kernel_threshold()).count();
        assert!((9_400..=10_600).contains(&kept), "{kept} of 100000 causes at 0.1");
        for &c in &causes[..1000] {
            let t = trace_for_cause(trace(0xdead, 0xbeef), c);
            assert_eq!(s.keeps(None, t), cause_random(c) >= s.kernel_threshold(), "user space decides as the kernel");
            assert_eq!(u128::from_be_bytes(t.to_bytes()) >> 64, 0xbeef, "the random high bits stay");
        }
        assert_eq!(Sampler::default().kernel_threshold(), 0);
        let off = from(&[("OTEL_TRACES_SAMPLER", "always_off")]).unwrap();
        assert!(causes.iter().all(|&c| cause_random(c) < off.kernel_threshold()), "always_off keeps none");
    }

    #[test]
    fn bad_values_are_one_line() {
        let e = from(&[("OTEL_TRACES_SAMPLER", "jaeger_remote")]).unwrap_err().to_string();
        assert!(e.contains("is not supported: use always_on"), "{e}");
        assert!(from(&[("OTEL_TRACES_SAMPLER", "traceidratio"), ("OTEL_TRACES_SAMPLER_ARG", "1.5")]).is_err());
        assert!(from(&[("OTEL_TRACES_SAMPLER", "traceidratio"), ("OTEL_TRACES_SAMPLER_ARG", "half")]).is_err());
        assert_eq!(from(&[("OTEL_TRACES_SAMPLER", "TraceIdRatio")]).unwrap().describe(), "traceidratio 1");
        assert_eq!(from(&[]).unwrap(), Sampler::default());
    }

    #[test]
    fn context_ids_are_the_kernels_and_keep_the_samplers_bits() {
        // bpf/ops.h's ctx_ids, term by term, for a cause with and without
        // CAUSE_DROP (which does not change them) and key [1, 2].
        let k = ContextKey([1, 2]);
        let c = 0x1234_5678_9a00u64;
        assert_eq!(k.trace_id(c), k.trace_id(c | CAUSE_DROP));
        assert_eq!(k.span_id(c), k.span_id(c | CAUSE_DROP));
        let t = u128::from_be_bytes(k.trace_id(c).to_bytes());
        assert_eq!(t as u64 & ((1 << 56) - 1), cause_random(c), "the sampler's 56 bits");
        assert_eq!((t >> 64) as u64, splitmix(c ^ 1));
        assert_eq!(u64::from_be_bytes(k.span_id(c).to_bytes()), splitmix(splitmix(c ^ 1) ^ 2));
        // Another key, other ids; another cause, other ids.
        assert_ne!(ContextKey([3, 2]).trace_id(c), k.trace_id(c));
        assert_ne!(k.span_id(c + 0x100), k.span_id(c));
        assert_eq!(splitmix(0), 0xe220_a839_7b1d_cdaf, "splitmix64's first output from seed 0");
    }
}
