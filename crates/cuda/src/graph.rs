//! CUDA graphs of one-token steps: the kernels of a decode step are captured once and
//! the executable graph is replayed for every following token whose recorded op list is
//! the same (same buffers, weights and shapes). Positions and token ids are not part of
//! the key: kernels read them from the step buffer in device memory, which the backend
//! rewrites before each replay.

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

/// A captured graph and the op list it was captured from.
pub struct Captured {
    key: Vec<Op>,
    step: DPtr,
    graph: Graph,
    /// Kernel launches in the graph.
    pub kernels: usize,
}

/// A few captured graphs (one per live decode configuration: session, context size).
#[derive(Default)]
pub struct GraphCache {
    entries: Vec<Captured>,
}

/// Graphs kept; older ones are dropped first.
const MAX_GRAPHS: usize = 8;

impl GraphCache {
    /// The graph captured from exactly these ops with this step buffer.
    pub fn find(&self, ops: &[Op], step: DPtr) -> Option<usize> {
        self.entries
            .iter()
            .position(|c| c.step == step && c.key == ops)
    }

    pub fn get(&self, i: usize) -> &Captured {
        &self.entries[i]
    }

    /// Drops every graph (after scratch memory they point to was replaced).
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// Captures what `enqueue` launches on the stream into a new graph and keeps it.
    pub fn capture(
        &mut self,
        gpu: &Gpu,
        ops: &[Op],
        step: DPtr,
        kernels: usize,
        enqueue: impl FnOnce() -> Result<()>,
    ) -> Result<usize> {
        let graph = Graph::capture(gpu, enqueue)?;
        if self.entries.len() >= MAX_GRAPHS {
            self.entries.remove(0);
        }
        self.entries.push(Captured {
            key: ops.to_vec(),
            step,
            graph,
            kernels,
        });
        Ok(self.entries.len() - 1)
    }

    /// Launches graph `i` on the stream.
    pub fn launch(&self, gpu: &Gpu, i: usize) -> Result<()> {
        self.entries[i].graph.launch(gpu)
    }
}
