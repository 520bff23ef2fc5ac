//! What spans are about: the [`resource`] of each traced process (process,
//! cgroup, container, Kubernetes attributes).
pub mod resource;
