//! What a cause says (pure): a cause is `ktime << 8 | drop << 7 | kind << 5
//! | CPU` (`enum cause_kind`, `bpf/uvspan.h`), made where the request or the
//! task started; `drop` (`CAUSE_DROP`): the kernel's sampler dropped its
//! trace.

use crate::kernel::skel::types::cause_kind;

/// A task: a callback no request caused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TaskKind {
    /// A batch of due JS timers (`setTimeout`, `setInterval`).
    Timers,
    /// A batch of immediates (`setImmediate`).
    Immediate,
    /// A socket's I/O callback no request caused (a queue consumer, a
    /// database client's reply to work no request started).
    Io,
}

impl TaskKind {
    /// The task's span name.
    pub fn name(self) -> &'static str {
        match self {
            TaskKind::Timers => "timers",
            TaskKind::Immediate => "immediate",
            TaskKind::Io => "io",
        }
    }
}

fn kind_bits(cause: u64) -> u32 {
    ((cause >> cause_kind::CAUSE_KIND_SHIFT.0) & cause_kind::CAUSE_KIND_MASK.0 as u64) as u32
}

/// The task a cause is, or None (no cause, or a request's).
pub fn task_of(cause: u64) -> Option<TaskKind> {
    match kind_bits(cause) {
        k if k == cause_kind::CAUSE_TIMERS.0 => Some(TaskKind::Timers),
        k if k == cause_kind::CAUSE_IMMEDIATE.0 => Some(TaskKind::Immediate),
        k if k == cause_kind::CAUSE_IO.0 => Some(TaskKind::Io),
        _ => None,
    }
}

/// When the request or task started (kernel monotonic ns).
pub fn started_ns(cause: u64) -> u64 {
    cause >> 8
}

/// A task's cause (for tests: what the BPF side makes).
#[cfg(test)]
pub fn make(kind: TaskKind, ts_ns: u64, cpu: u64) -> u64 {
    let k = match kind {
        TaskKind::Timers => cause_kind::CAUSE_TIMERS.0,
        TaskKind::Immediate => cause_kind::CAUSE_IMMEDIATE.0,
        TaskKind::Io => cause_kind::CAUSE_IO.0,
    };
    (ts_ns << 8) | (u64::from(k) << cause_kind::CAUSE_KIND_SHIFT.0) | (cpu & cause_kind::CAUSE_CPU_MASK.0 as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_says_its_kind_and_start() {
        for kind in [TaskKind::Timers, TaskKind::Immediate, TaskKind::Io] {
            for cpu in [0, 5, 31, 200] {
                let c = make(kind, 123_456_789, cpu);
                assert_eq!(task_of(c), Some(kind));
                assert_eq!(started_ns(c), 123_456_789);
            }
        }
        // A request's cause (kind 0, any CPU) and no cause are no task.
        assert_eq!(task_of((987_654 << 8) | 31), None);
        assert_eq!(task_of(0), None);
        // The sampler's drop bit is not part of the kind.
        let dropped = make(TaskKind::Io, 5, 3) | crate::events::sampler::CAUSE_DROP;
        assert_eq!((task_of(dropped), started_ns(dropped)), (Some(TaskKind::Io), 5));
        assert_eq!(task_of((1 << 8) | crate::events::sampler::CAUSE_DROP), None, "a dropped request's");
    }
}
