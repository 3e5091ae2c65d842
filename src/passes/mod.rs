//! The passes that turn an instantiated graph into a runnable program, one job per file, run in
//! this order by `lower::lower`:
//!
//! 1. [`fuse`]: replace the patterns of `graphs/fusions.ron` by fused ops, then [`group`]: merge
//!    the sibling nodes of `graphs/groups.ron` (horizontal fusion);
//! 2. [`schedule`]: choose a kernel variant for every node from `graphs/rules.ron`;
//! 3. [`memplan`]: mark the last use of every value, size every value and lay them all out in one
//!    arena, values whose lifetimes are disjoint sharing bytes;
//! 4. [`segment`]: cut the program into runs of nodes that need no host work between them (one
//!    CUDA graph each);
//! 5. [`validate`]: check the program's invariants (order, definitions, shapes, variants, arena,
//!    segments).

pub mod fuse;
pub mod group;
pub mod memplan;
pub mod schedule;
pub mod segment;
pub mod validate;
