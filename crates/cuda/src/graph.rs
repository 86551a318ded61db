//! CUDA graphs of one-token steps: the kernels of a decode step are captured once and
//! replayed for every following token whose recorded op list is the same (same buffers,
//! weights and shapes). Positions and token ids are not part of the key: kernels read
//! them from the step buffer in device memory, which the backend rewrites before each
//! replay.
//!
//! A step's graph is a chain of segments, each captured from a run of its commands (the
//! first short, each next one four times longer): while the model records a step, each
//! segment is launched as soon as the ops it was captured from have been recorded again,
//! so the device starts on the first layers while the host still records the last ones.

use std::ops::Range;

use cudarc::driver::{result, sys};

use crate::driver::{DPtr, Gpu};
use crate::error::{CudaError, Result};
use crate::ops::Op;

/// An instantiated graph of what was enqueued on a device's stream during a capture.
pub struct Graph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

// SAFETY: graph handles are usable from any thread of the context; callers serialise
// launches (the backend under its state lock).
unsafe impl Send for Graph {}

impl Graph {
    /// Captures what `enqueue` puts on `gpu`'s stream (kernels, copies, NCCL
    /// collectives) and instantiates it; nothing runs until [`Graph::launch`].
    pub fn capture(gpu: &Gpu, enqueue: impl FnOnce() -> Result<()>) -> Result<Graph> {
        gpu.bind()?;
        let s = gpu.stream();
        // SAFETY: our stream; thread-local mode so other threads' unrelated CUDA calls
        // are not affected.
        unsafe {
            result::stream::begin_capture(
                s,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        }
        .map_err(|e| CudaError::driver("cuStreamBeginCapture", e))?;
        let enq = enqueue();
        // SAFETY: ends the capture begun above, whatever `enqueue` did.
        let graph = unsafe { result::stream::end_capture(s) };
        enq?;
        let graph = graph.map_err(|e| CudaError::driver("cuStreamEndCapture", e))?;
        // SAFETY: a graph just captured.
        match unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) } {
            Ok(exec) => Ok(Graph { graph, exec }),
            Err(e) => {
                // SAFETY: destroys the graph captured above.
                unsafe {
                    let _ = result::graph::destroy(graph);
                }
                Err(CudaError::driver("cuGraphInstantiate", e))
            }
        }
    }

    /// Launches the graph on `gpu`'s stream.
    pub fn launch(&self, gpu: &Gpu) -> Result<()> {
        gpu.bind()?;
        // SAFETY: a live executable graph and our stream.
        unsafe { result::graph::launch(self.exec, gpu.stream()) }
            .map_err(|e| CudaError::driver("cuGraphLaunch", e))
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: created by `capture`; no launch of them is in flight after a sync,
        // and destroying an exec with pending launches is allowed by CUDA.
        unsafe {
            let _ = result::graph::exec_destroy(self.exec);
            let _ = result::graph::destroy(self.graph);
        }
    }
}

/// One segment of a step: the graph captured from a run of the step's commands and the
/// ops they were lowered from.
struct Segment {
    key: Vec<Op>,
    graph: Graph,
}

/// The graphs of one decode step, in the order they run.
pub struct Chain {
    step: DPtr,
    segs: Vec<Segment>,
    /// Kernel launches in all of them.
    pub kernels: usize,
}

/// A few captured steps (one per live decode configuration: session, context size).
#[derive(Default)]
pub struct GraphCache {
    chains: Vec<Chain>,
    /// Counts clears and evictions: a chain followed across one is gone (or moved).
    generation: u64,
}

/// Chains kept; older ones are dropped first.
const MAX_GRAPHS: usize = 8;

/// Commands in a step's first segment; each next one takes four times as many.
pub const FIRST_SEGMENT: usize = 16;

impl GraphCache {
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The chains of step buffer `step`.
    pub fn chains_of(&self, step: DPtr) -> Vec<usize> {
        (0..self.chains.len())
            .filter(|&c| self.chains[c].step == step)
            .collect()
    }

    /// The op count at which the segment after the first `s` of any of `cands` ends
    /// beyond `after`, counting from `from`: where a recording checks next.
    pub fn next_cut(&self, cands: &[usize], s: usize, from: usize, after: usize) -> Option<usize> {
        cands
            .iter()
            .filter_map(|&c| self.segment_len(c, s))
            .map(|l| from + l)
            .filter(|&x| x > after)
            .min()
    }

    pub fn segments(&self, c: usize) -> usize {
        self.chains[c].segs.len()
    }

    /// The chain of step buffer `step` whose segments were captured from `ops`, all of it.
    pub fn find_whole(&self, ops: &[Op], step: DPtr) -> Option<usize> {
        self.chains.iter().position(|c| {
            let mut at = 0;
            c.step == step
                && c.segs.iter().all(|g| {
                    let end = at + g.key.len();
                    let same = end <= ops.len() && g.key == ops[at..end];
                    at = end;
                    same
                })
                && at == ops.len()
        })
    }

    /// The op count of segment `s` of chain `c` (`None` past its last).
    pub fn segment_len(&self, c: usize, s: usize) -> Option<usize> {
        self.chains[c].segs.get(s).map(|g| g.key.len())
    }

    /// Whether chain `c` has a segment `s` and it was captured from `ops`.
    pub fn segment_is(&self, c: usize, s: usize, ops: &[Op]) -> bool {
        self.chains[c].segs.get(s).is_some_and(|g| g.key == ops)
    }

    pub fn get(&self, c: usize) -> &Chain {
        &self.chains[c]
    }

    /// Drops every chain (after scratch memory they point to was replaced).
    pub fn clear(&mut self) {
        self.chains.clear();
        self.generation += 1;
    }

    /// Captures one graph per segment — `parts` pairs a segment's ops with what
    /// `enqueue(i)` launches for it — and keeps them as one chain.
    pub fn capture(
        &mut self,
        gpu: &Gpu,
        step: DPtr,
        parts: &[&[Op]],
        kernels: usize,
        mut enqueue: impl FnMut(usize) -> Result<()>,
    ) -> Result<usize> {
        let mut segs = Vec::with_capacity(parts.len());
        for (i, ops) in parts.iter().enumerate() {
            segs.push(Segment {
                key: ops.to_vec(),
                graph: Graph::capture(gpu, || enqueue(i))?,
            });
        }
        if self.chains.len() >= MAX_GRAPHS {
            // The others' indices move: a recording following one stops.
            self.chains.remove(0);
            self.generation += 1;
        }
        self.chains.push(Chain {
            step,
            segs,
            kernels,
        });
        Ok(self.chains.len() - 1)
    }

    /// Launches segment `s` of chain `c` on the stream.
    pub fn launch(&self, gpu: &Gpu, c: usize, s: usize) -> Result<()> {
        self.chains[c].segs[s].graph.launch(gpu)
    }
}

/// Where a step's lowered commands split into segments: for each segment, its commands
/// and the ops they come from (`origin`: the first op of each command; `n_ops` ops in
/// all). A cut goes only where every command before it comes from earlier ops and every
/// command from it on from later ones (a launch the lowering inserts out of op order, as
/// `hc_sinkhorn`, is never separated from its op), at least [`FIRST_SEGMENT`] commands
/// in, then four times the previous segment's length further.
pub fn segment_ranges(origin: &[usize], n_ops: usize) -> Vec<(Range<usize>, Range<usize>)> {
    let n = origin.len();
    let mut suffix_min = vec![usize::MAX; n + 1];
    for c in (0..n).rev() {
        suffix_min[c] = suffix_min[c + 1].min(origin[c]);
    }
    let mut segs = Vec::new();
    let (mut start, mut want, mut max_before) = (0, FIRST_SEGMENT, None::<usize>);
    let mut op_start = 0;
    for c in 0..n {
        if c >= start + want
            && max_before.is_none_or(|m| origin[c] > m)
            && suffix_min[c] == origin[c]
        {
            segs.push((start..c, op_start..origin[c]));
            want = 4 * (c - start);
            (start, op_start) = (c, origin[c]);
        }
        max_before = Some(max_before.map_or(origin[c], |m| m.max(origin[c])));
    }
    segs.push((start..n, op_start..n_ops));
    segs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_grow_fourfold_and_keep_out_of_order_launches_with_their_op() {
        // 200 commands, one per op, except that command 17 comes from op 15 (as an
        // `hc_sinkhorn` placed after the command following its `hc_post_pre`).
        let mut origin: Vec<usize> = (0..200).collect();
        origin.insert(17, 15);
        origin.pop();
        let segs = segment_ranges(&origin, 200);
        // No cut at 16 or 17 (command 17's op 15 is before command 16's op 16): the first
        // segment ends at 18, the next one 4 × 18 = 72 commands later.
        assert_eq!(segs, [(0..18, 0..17), (18..90, 17..89), (90..200, 89..200)]);
        for (cmds, ops) in &segs {
            assert!(origin[cmds.clone()].iter().all(|o| ops.contains(o)));
        }
        assert_eq!(
            segment_ranges(&origin[..FIRST_SEGMENT], 16),
            [(0..16, 0..16)]
        );
    }
}
