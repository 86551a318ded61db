//! GPU checks and measurements in one binary, for `scripts/gpu-check.sh` on a CUDA
//! machine without a Rust toolchain (until the `ds4-server` CLI wires the same library
//! calls):
//!
//! ```text
//! gpu_check info                      device, NVRTC, copy bandwidth
//! gpu_check gen                       device generators == host generators, every type
//! gpu_check parity SPEC...            CUDA vs CPU logits on synthetic models (SHAPE:QUANT)
//! gpu_check bench SPEC [--runs N] [--decode N] [--prefill A,B] [--variants] [--profile] [--ab ROUNDS]
//!                      [--first-layer K] [--layers N] [--without LABEL]... [--host-profile]
//!                      [--context N] [--sweep] [--step-times]
//!                                     (--context: the prompt prefilled before each decode
//!                                     run, default 16 tokens; --without: launches of that
//!                                     label left out of the decode graphs, to time them
//!                                     inside a replay; --sweep: each label of the decode
//!                                     step left out in turn, in this one load;
//!                                     --host-profile: the host sampled during the decode
//!                                     runs, built with --features host-profile;
//!                                     --step-times: one more run, each step's wall time,
//!                                     how it ran and its device time)
//! gpu_check gemv                      single-matrix GEMV bandwidth (llama3-8b shapes)
//! gpu_check warm-cache [ARCH]         compile the kernels into $DS4_CUDA_CACHE (no GPU needed)
//! gpu_check conformance [FILTER]      every backend operation vs its reference (ds4-conformance)
//! gpu_check model FIXTURE GGUF [--bf16] a MoE family's golden master on CUDA and the CPU
//! gpu_check same-file SPEC|GGUF       a quantized MoE model: CUDA vs CPU top-10 log-probs
//! gpu_check trace FIXTURE GGUF [POS...] a MoE golden master's prompt on CUDA and the CPU:
//!                                     per layer, CUDA's error against the CPU at POS
//! gpu_check soak SPEC [--minutes M] [--ctx N] [--every S] [--max-growth MIB]
//!                                     decode with rewinds, snapshots and resets for M
//!                                     minutes, GPU memory sampled: its growth
//! gpu_check nccl                      a one-rank NCCL communicator on GPU 0: all-reduce and
//!                                     all-gather, eager and captured in a CUDA graph
//! ```
//!
//! Lines starting with `RESULT ` are JSON for the benchmark notes. Exit status 1 when a
//! parity tolerance (docs/parity.md) is exceeded.

mod families;
mod host_profile;
mod soak;
mod trace;

use std::cell::RefCell;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use ds4_cuda::bench::{DecodeFigures, copy_bandwidth, median};
use ds4_cuda::parity::{Report, argmax, compare, test_tokens};
use ds4_cuda::synth::{Family, Spec, generate, write_gguf};
use ds4_cuda::{CudaBackend, load_model, load_synthetic};
use ds4_engine::backend::Prec;
use ds4_engine::{Model, Session};
use ds4_gguf::{GgmlType, GgufFile};

pub(crate) type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args.first().map(String::as_str) {
        Some("info") => info(),
        Some("gen") => gen_check(),
        Some("parity") => parity(&args[1..]),
        Some("bench") => bench(&args[1..]),
        Some("gemv") => gemv_bench(),
        Some("warm-cache") => warm_cache(args.get(1).map_or("sm_90a", String::as_str)),
        Some("conformance") => families::conformance(args.get(1).map_or("", String::as_str)),
        Some("model") => families::model(&args[1..]),
        Some("same-file") => families::same_file(&args[1..]),
        Some("trace") => trace::trace(&args[1..]),
        Some("soak") => soak::soak(&args[1..]),
        Some("nccl") => nccl_check(),
        _ => Err("usage: gpu_check info | gen | parity SPEC... | bench SPEC [--runs N] [--decode N] [--prefill A,B] [--variants] [--profile] [--ab ROUNDS] [--first-layer K] [--layers N] [--without LABEL]... [--host-profile] [--context N] [--step-times] | gemv | warm-cache [ARCH] | conformance [FILTER] | model FIXTURE GGUF [--bf16] | same-file SPEC|GGUF | trace FIXTURE GGUF [POS...] | soak SPEC [--minutes M] [--ctx N] [--every S] [--max-growth MIB] | nccl".into()),
    };
    if let Err(e) = r {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn info() -> Res<()> {
    let b = CudaBackend::new(0)?;
    let g = b.gpu();
    let (free, total) = g.mem_info()?;
    println!(
        "device: {} ({} SMs, cc {}.{}, arch {}), {:.1}/{:.1} GiB free",
        g.name,
        g.n_sm,
        g.cc.0,
        g.cc.1,
        g.arch(),
        gib(free),
        gib(total)
    );
    println!("nvrtc: {:?}", ds4_cuda::compile::nvrtc_version()?);
    let bw = copy_bandwidth(g, b.kernels(), 1 << 30, 10)?;
    println!(
        "copy bandwidth: {:.3} TB/s (median of {}, runs {:?})",
        bw.bytes_per_s / 1e12,
        bw.runs.len(),
        tb(&bw.runs)
    );
    println!(
        "RESULT {{\"kind\":\"copy\",\"bytes_per_s\":{:.6e},\"runs\":{:?}}}",
        bw.bytes_per_s, bw.runs
    );
    Ok(())
}

fn warm_cache(arch: &str) -> Res<()> {
    for s in ds4_cuda::compile::SOURCES {
        let bin = ds4_cuda::compile::cubin(s.file, s.text, arch)?;
        println!("{}: {} bytes for {arch}", s.file, bin.len());
    }
    Ok(())
}

/// A one-rank communicator on GPU 0: an all-reduce (sum) and an all-gather of 4096 f32
/// must return the input bit for bit, first enqueued directly, then captured in a CUDA
/// graph whose replay reads the buffers' new contents; then the mean time of a replayed
/// all-reduce + all-gather. Without libnccl: a skip line, exit 0.
fn nccl_check() -> Res<()> {
    let version = match ds4_cuda::nccl::version() {
        Ok(v) => v,
        Err(e) => {
            println!("nccl: skipped: {e}");
            return Ok(());
        }
    };
    println!(
        "nccl: version {}.{}.{}, NCCL_NVLS_ENABLE={}",
        version.0,
        version.1,
        version.2,
        std::env::var("NCCL_NVLS_ENABLE").unwrap_or_default()
    );
    let gpu = ds4_cuda::driver::Gpu::new(0)?;
    let comm = ds4_cuda::nccl::Comm::init_all(std::slice::from_ref(&gpu))?;
    let comm = &comm[0];
    const N: usize = 4096;
    let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let read = |p: u64| -> Res<Vec<f32>> {
        let mut b = vec![0u8; N * 4];
        gpu.dtoh(&mut b, p)?;
        Ok(b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    };
    let (send, reduced, gathered) = (gpu.alloc(N * 4)?, gpu.alloc(N * 4)?, gpu.alloc(N * 4)?);
    let enqueue = || -> ds4_cuda::Result<()> {
        comm.all_reduce_sum_f32(send.ptr(), reduced.ptr(), N)?;
        comm.all_gather_f32(send.ptr(), gathered.ptr(), N)
    };
    let mut bad = 0;
    let mut check = |what: &str, want: &[f32]| -> Res<()> {
        for (name, p) in [
            ("all-reduce", reduced.ptr()),
            ("all-gather", gathered.ptr()),
        ] {
            let got = read(p)?;
            let same = got
                .iter()
                .zip(want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            println!("nccl {what} {name}: {}", if same { "ok" } else { "WRONG" });
            bad += usize::from(!same);
        }
        Ok(())
    };
    let first: Vec<f32> = (0..N).map(|i| i as f32 * 0.5 - 7.25).collect();
    gpu.htod(send.ptr(), &bytes(&first))?;
    enqueue()?;
    check("eager", &first)?;
    let graph = ds4_cuda::Graph::capture(&gpu, enqueue)?;
    let second: Vec<f32> = first.iter().map(|x| -3.0 * x + 1.0).collect();
    gpu.htod(send.ptr(), &bytes(&second))?;
    graph.launch(&gpu)?;
    check("graph", &second)?;
    let (start, end) = (gpu.event()?, gpu.event()?);
    let reps = 200;
    start.record()?;
    for _ in 0..reps {
        graph.launch(&gpu)?;
    }
    end.record()?;
    let us = start.elapsed_ms(&end)? as f64 * 1e3 / reps as f64;
    println!(
        "nccl: one rank, all-reduce + all-gather of {N} f32 in a graph: {us:.2} us per replay"
    );
    println!(
        "RESULT {{\"kind\":\"nccl\",\"ranks\":1,\"version\":\"{}.{}.{}\",\"count\":{N},\"us_per_replay\":{us:.3}}}",
        version.0, version.1, version.2
    );
    if bad > 0 {
        return Err(format!("{bad} NCCL results differ from the input").into());
    }
    Ok(())
}

fn gib(b: usize) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

fn tb(v: &[f64]) -> Vec<String> {
    v.iter().map(|x| format!("{:.3}", x / 1e12)).collect()
}

fn gen_check() -> Res<()> {
    let b = CudaBackend::new(0)?;
    let mut bad = 0;
    let floats = [GgmlType::F16, GgmlType::BF16];
    for ty in ds4_cuda::layout::MATRIX_TYPES.into_iter().chain(floats) {
        let key = generate::tensor_key(7, "blk.3.ffn_down.weight");
        let n = 3001;
        let dev = ds4_cuda::weights::synth_on_device(b.gpu(), b.kernels(), ty, key, n)?;
        let host = if floats.contains(&ty) {
            generate::floats(ty, key, n)
        } else {
            generate::blocks(ty, key, n)
        };
        let ok = dev == host;
        println!("gen {ty}: {}", if ok { "identical" } else { "DIFFERENT" });
        bad += usize::from(!ok);
    }
    if bad > 0 {
        return Err(format!("{bad} types generate different bytes on the device").into());
    }
    Ok(())
}

fn parity(specs: &[String]) -> Res<()> {
    let dir = std::env::temp_dir().join(format!("ds4-parity-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let gpu = Arc::new(CudaBackend::new(0)?);
    let mut failures = Vec::new();
    for name in specs {
        match parity_one(name, &dir, &gpu) {
            Ok(true) => {}
            Ok(false) => failures.push(name.clone()),
            Err(e) => {
                println!("{name}: ERROR {e}");
                failures.push(name.clone());
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!("parity failed: {failures:?}").into())
    }
}

fn parity_one(name: &str, dir: &std::path::Path, gpu: &Arc<CudaBackend>) -> Res<bool> {
    let spec = Spec::parse(name)?;
    let path: PathBuf = dir.join(format!("{}.gguf", name.replace([':', '.'], "_")));
    let t0 = Instant::now();
    write_gguf(&spec, &path)?;
    let file = Arc::new(GgufFile::open(&path)?);
    let cpu = ds4_engine::loader::load_model(&file, &path)?;
    let cuda = load_model(gpu.clone(), &file, &path)?;
    let n_vocab = cpu.info().n_vocab;
    // The f64 reference costs O(parameters × tokens) on the host: fewer tokens for
    // large models.
    let big = spec.weight_bytes() > 200_000_000;
    let tokens = test_tokens(if big { 20 } else { 40 }, n_vocab, 42);
    // The f64 reference is the dense graph's.
    let reference = matches!(spec.family, Family::Dense { .. }).then_some(&*file);
    let rep = compare(&cpu, &cuda, &tokens, 16, reference)?;
    // The synthetic model built in GPU memory must equal the file's, bit for bit.
    let synth = load_synthetic(&spec, 0)?.model;
    let same = decode_logits(&synth, &tokens[..12])? == decode_logits(&cuda, &tokens[..12])?;
    let ok = print_report(name, &rep, same, t0.elapsed().as_secs_f64());
    if !ok {
        // Localize: the same comparison without graphs and programmatic launch.
        gpu.set_graphs(false);
        gpu.set_pdl(false);
        let plain = compare(&cpu, &cuda, &tokens, 16, None);
        gpu.set_graphs(true);
        gpu.set_pdl(true);
        if let Ok(r) = plain {
            print_report(
                &format!("{name} (no graphs, no PDL)"),
                &r,
                same,
                t0.elapsed().as_secs_f64(),
            );
        }
    }
    std::fs::remove_file(&path)?;
    Ok(ok)
}

fn decode_logits(m: &Arc<dyn Model>, tokens: &[u32]) -> Res<Vec<f32>> {
    let mut s = Session::new(m.clone(), tokens.len() + 1)?;
    let mut out = s.prefill(&tokens[..4], &mut |_, _| {})?.to_vec();
    for &t in &tokens[4..] {
        out.extend_from_slice(s.decode(t)?);
    }
    Ok(out)
}

fn print_report(name: &str, r: &Report, synth_same: bool, secs: f64) -> bool {
    let ok = r.passes() && synth_same;
    let refs = r.reference.map_or(String::new(), |x| {
        format!(
            " | vs f64 reference (median/max): cpu {:.2e}/{:.2e} gpu-prefill {:.2e}/{:.2e} gpu-decode {:.2e}/{:.2e}",
            x.cpu.median, x.cpu.max, x.gpu_prefill.median, x.gpu_prefill.max, x.gpu_decode.median, x.gpu_decode.max
        )
    });
    println!(
        "{name}: {} | gpu vs cpu: decode nrmse med {:.2e} max {:.2e} maxabs {:.2e} argmax-miss {}/{}; prefill nrmse med {:.2e} max {:.2e} argmax-miss {}/{}{refs} | greedy {}/{} (cpu gap at divergence {:?}) | deterministic {} | synthetic==file {} | {:.1}s",
        if ok { "PASS" } else { "FAIL" },
        r.decode.median_nrmse,
        r.decode.max_nrmse,
        r.decode.max_abs,
        r.decode.argmax_mismatch,
        r.decode.rows,
        r.prefill.median_nrmse,
        r.prefill.max_nrmse,
        r.prefill.argmax_mismatch,
        r.prefill.rows,
        r.greedy_common(),
        r.greedy_cpu.len(),
        r.greedy_divergence_gap,
        r.deterministic,
        synth_same,
        secs
    );
    let rj = r.reference.map_or("null".to_string(), |x| {
        format!(
            "{{\"cpu_median\":{:.3e},\"cpu_max\":{:.3e},\"gpu_prefill_median\":{:.3e},\"gpu_prefill_max\":{:.3e},\"gpu_decode_median\":{:.3e},\"gpu_decode_max\":{:.3e}}}",
            x.cpu.median, x.cpu.max, x.gpu_prefill.median, x.gpu_prefill.max, x.gpu_decode.median, x.gpu_decode.max
        )
    });
    println!(
        "RESULT {{\"kind\":\"parity\",\"model\":\"{name}\",\"pass\":{ok},\"decode_median_nrmse\":{:.3e},\"decode_max_nrmse\":{:.3e},\"prefill_median_nrmse\":{:.3e},\"prefill_max_nrmse\":{:.3e},\"reference\":{rj},\"greedy_common\":{},\"greedy_len\":{},\"deterministic\":{},\"synthetic_equal\":{}}}",
        r.decode.median_nrmse,
        r.decode.max_nrmse,
        r.prefill.median_nrmse,
        r.prefill.max_nrmse,
        r.greedy_common(),
        r.greedy_cpu.len(),
        r.deterministic,
        synth_same
    );
    ok
}

struct BenchOpts {
    runs: usize,
    decode: usize,
    prefill: Vec<usize>,
    variants: bool,
    profile: bool,
    /// Rounds of the paired decode comparison of kernel configurations (0: none).
    ab: usize,
    /// A layer window of the model (`--first-layer K --layers N`): real layers
    /// K..K+N-1, for quick profiles of every layer kind.
    first_layer: usize,
    layers: Option<usize>,
    /// Launch labels left out of the decode graphs (`--without`, repeatable): what each
    /// kind of launch costs inside a replay, against a run without the option.
    without: Vec<String>,
    /// Sample the host during the timed decode runs (`--host-profile`).
    host_profile: bool,
    /// Tokens of the prompt prefilled before each decode run (`--context`).
    context: usize,
    /// Each launch label of the decode step left out in turn (`--sweep`).
    sweep: bool,
    /// One more decode run, each step's wall time printed (`--step-times`).
    step_times: bool,
}

fn bench(args: &[String]) -> Res<()> {
    let name = args.first().ok_or("bench needs a synthetic model name")?;
    let mut o = BenchOpts {
        runs: 5,
        decode: 128,
        prefill: vec![512, 4096],
        variants: false,
        profile: false,
        ab: 0,
        first_layer: 0,
        layers: None,
        without: Vec::new(),
        host_profile: false,
        context: 16,
        sweep: false,
        step_times: false,
    };
    let mut i = 1;
    while i < args.len() {
        let v = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--runs" => o.runs = v.parse()?,
            "--ab" => o.ab = v.parse()?,
            "--first-layer" => o.first_layer = v.parse()?,
            "--layers" => o.layers = Some(v.parse()?),
            "--without" => o.without.push(v),
            "--decode" => o.decode = v.parse()?,
            "--context" => o.context = v.parse()?,
            "--prefill" => {
                o.prefill = v
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::parse)
                    .collect::<Result<_, _>>()?
            }
            "--variants" => {
                o.variants = true;
                i += 1;
                continue;
            }
            "--profile" => {
                o.profile = true;
                i += 1;
                continue;
            }
            "--sweep" => {
                o.sweep = true;
                i += 1;
                continue;
            }
            "--step-times" => {
                o.step_times = true;
                i += 1;
                continue;
            }
            "--host-profile" => {
                o.host_profile = true;
                i += 1;
                continue;
            }
            a => return Err(format!("unknown option {a}").into()),
        }
        i += 2;
    }
    let t0 = Instant::now();
    let spec = Spec::parse(name)?.window(o.first_layer, o.layers)?;
    let ds4_cuda::Synthetic { backend, model, .. } = load_synthetic(&spec, 0)?;
    backend.synchronize()?;
    let load_s = t0.elapsed().as_secs_f64();
    if !o.without.is_empty() {
        backend.set_without(&o.without);
        println!(
            "without {:?}: left out of the decode graphs (the logits are wrong; only the time counts)",
            o.without
        );
    }
    let bw = copy_bandwidth(backend.gpu(), backend.kernels(), 1 << 30, 10)?;
    let info = model.info().clone();
    println!(
        "{name}: {} ({} layers), {:.3} GB weights read per decode token, loaded in {load_s:.1}s; copy bandwidth {:.3} TB/s",
        info.name,
        info.n_layer,
        info.decode_weight_bytes as f64 / 1e9,
        bw.bytes_per_s / 1e12
    );
    let prompt = test_tokens(o.context.max(1), info.n_vocab, 1);
    // Every decode run goes on one session, emptied first, as the server keeps one per
    // worker (and llama-bench one context per test): its buffers stay where the first
    // run's graphs were captured, so the runs after it replay them as a request does.
    let longest = o.decode.max(SHORT_RUN);
    let session = RefCell::new(Session::new(model.clone(), prompt.len() + longest + 1)?);
    // n greedy decode steps after the prompt's prefill (`start` runs between the two),
    // each queued before the previous choice is read, as generation decodes greedily:
    // tokens per second.
    let greedy = |n: usize, start: &dyn Fn()| -> Res<f64> {
        if n > longest {
            return Err(format!("{n} decode steps: at most {longest} fit the session").into());
        }
        let mut s = session.borrow_mut();
        s.reset()?;
        let t = argmax(s.prefill(&prompt, &mut |_, _| {})?) as u32;
        start();
        let t0 = Instant::now();
        let end = s.decode_greedy(t, n, &mut |_| std::ops::ControlFlow::Continue(()))?;
        if end != ds4_engine::GreedyEnd::Max {
            return Err(format!("{n} greedy decode steps ended early: {end:?}").into());
        }
        Ok(n as f64 / t0.elapsed().as_secs_f64())
    };
    let decode_run = |n: usize| greedy(n, &|| {});
    let cold = backend.stats();
    let first = decode_run(o.decode)?;
    println!(
        "first decode run on the new session: {first:.1} tok/s ({} graphs captured)",
        backend.stats().graph_captures - cold.graph_captures
    );
    let sampler = o
        .host_profile
        .then(host_profile::HostProfile::start)
        .transpose()?;
    let before = backend.stats();
    let dec: Vec<f64> = (0..o.runs)
        .map(|_| decode_run(o.decode))
        .collect::<Res<_>>()?;
    let after = backend.stats();
    if let Some(p) = sampler {
        p.print(40)?;
    }
    let fig = DecodeFigures::new(median(&dec), info.decode_weight_bytes, bw.bytes_per_s);
    let replays = after.graph_replays - before.graph_replays;
    let captures = after.graph_captures - before.graph_captures;
    let eager = after.eager_steps - before.eager_steps;
    println!(
        "decode {} tok: median {:.1} tok/s (min {:.1}, max {:.1}, runs {:?}) = {:.3} TB/s = {:.1}% of copy; {} kernels/token; graph replays {replays} of {} steps ({captures} graphs captured; {eager} steps eager, the prompts' included)",
        o.decode,
        fig.tokens_per_s,
        min(&dec),
        max(&dec),
        round1(&dec),
        fig.achieved_bytes_per_s / 1e12,
        100.0 * fig.fraction_of_copy,
        after.decode_kernels,
        o.runs * o.decode
    );
    println!(
        "RESULT {{\"kind\":\"decode\",\"model\":\"{name}\",\"tokens\":{},\"tps_median\":{:.2},\"tps_runs\":{:?},\"weight_bytes\":{},\"achieved_bytes_per_s\":{:.4e},\"copy_bytes_per_s\":{:.4e},\"fraction\":{:.4},\"kernels_per_token\":{},\"graph_replays\":{replays}}}",
        o.decode,
        fig.tokens_per_s,
        round1(&dec),
        info.decode_weight_bytes,
        fig.achieved_bytes_per_s,
        bw.bytes_per_s,
        fig.fraction_of_copy,
        after.decode_kernels
    );
    let st = backend.stats();
    if st.graph_timed > 0 {
        let gpu_ms = st.graph_gpu_ms / st.graph_timed as f64;
        println!(
            "decode step: {:.3} ms on the device per graph replay ({} timed) vs {:.3} ms wall per token",
            gpu_ms,
            st.graph_timed,
            1e3 / fig.tokens_per_s
        );
        println!(
            "RESULT {{\"kind\":\"decode_gpu_time\",\"model\":\"{name}\",\"graph_ms\":{gpu_ms:.4},\"wall_ms\":{:.4}}}",
            1e3 / fig.tokens_per_s
        );
        // The host's part of a replayed step, measured over the timed runs.
        let n = replays.max(1) as f64;
        let per = |a: f64, b: f64| (a - b) / n;
        let record = per(after.host_record_ms, before.host_record_ms);
        let launch = per(after.host_launch_ms, before.host_launch_ms);
        let read = per(after.host_read_ms, before.host_read_ms);
        println!(
            "host per replayed step: {record:.3} ms recording the ops, {launch:.3} ms finding and launching the graph, {read:.3} ms waiting for the device, {:.3} ms the rest (the session's own work)",
            1e3 / fig.tokens_per_s - record - launch - read
        );
    }
    if o.step_times {
        step_times(&backend, &model, &prompt, o.decode)?;
    }
    if o.ab > 0 {
        ab_compare(name, &backend, o.ab, o.decode, &decode_run)?;
    }
    if o.sweep {
        sweep(
            name,
            &backend,
            o.decode,
            &decode_run,
            &profile_labels(&backend, &greedy)?,
        )?;
        // The sweep ends with every launch; the runs below leave out what was asked.
        backend.set_without(&o.without);
    }
    // The decode steps profiled alone (the prefill's kernels would otherwise count into
    // the decode kernels' averages).
    let profile_run = |n: usize| -> Res<Vec<ds4_cuda::ProfileRow>> {
        let run = greedy(n, &|| {
            backend.set_profile(true);
            backend.take_profile();
        });
        backend.set_profile(false);
        let rows = backend.take_profile();
        run.map(|_| rows)
    };
    for (label, cfg) in profile_configs(o.profile) {
        cfg.apply(&backend);
        backend.set_graphs(false);
        let n = SHORT_RUN;
        let rows = profile_run(n);
        backend.set_graphs(true);
        println!("profile configuration: {label}");
        print_profile(
            name,
            "decode",
            rows?,
            n,
            &format!("{n} eager decode steps (events around each kernel, no PDL)"),
        );
    }
    KernelConfig::DEFAULT.apply(&backend);
    if o.variants {
        for (label, graphs, pdl) in [
            ("no-pdl", true, false),
            ("no-graph", false, true),
            ("no-graph-no-pdl", false, false),
        ] {
            backend.set_graphs(graphs);
            backend.set_pdl(pdl);
            decode_run(SHORT_RUN)?;
            let v: Vec<f64> = (0..3).map(|_| decode_run(o.decode)).collect::<Res<_>>()?;
            println!(
                "decode variant {label}: median {:.1} tok/s runs {:?} ({} kernels/token)",
                median(&v),
                round1(&v),
                backend.stats().decode_kernels
            );
            println!(
                "RESULT {{\"kind\":\"decode_variant\",\"model\":\"{name}\",\"variant\":\"{label}\",\"tps_median\":{:.2},\"tps_runs\":{:?}}}",
                median(&v),
                round1(&v)
            );
        }
        backend.set_graphs(true);
        backend.set_pdl(true);
    }
    for &n in &o.prefill {
        if n > info.n_ctx_train {
            continue;
        }
        let toks = test_tokens(n, info.n_vocab, 2);
        let run = || -> Res<f64> {
            let mut s = Session::new(model.clone(), n)?;
            let t0 = Instant::now();
            s.prefill(&toks, &mut |_, _| {})?;
            Ok(n as f64 / t0.elapsed().as_secs_f64())
        };
        run()?;
        let v: Vec<f64> = (0..o.runs.min(3)).map(|_| run()).collect::<Res<_>>()?;
        println!(
            "prefill {n} tok: median {:.0} tok/s (min {:.0}, max {:.0}, runs {:?})",
            median(&v),
            min(&v),
            max(&v),
            round1(&v)
        );
        println!(
            "RESULT {{\"kind\":\"prefill\",\"model\":\"{name}\",\"tokens\":{n},\"tps_median\":{:.1},\"tps_runs\":{:?}}}",
            median(&v),
            round1(&v)
        );
        if o.profile {
            backend.set_profile(true);
            backend.take_profile();
            let done = run();
            backend.set_profile(false);
            let rows = backend.take_profile();
            done?;
            print_profile(
                name,
                &format!("prefill {n}"),
                rows,
                n,
                &format!("a {n}-token prefill (events around each kernel), per token"),
            );
        }
    }
    Ok(())
}

/// One more decode run of `n` steps after `prompt`, each step's wall time printed with how
/// it ran (`r` a graph replay, `c` a capture, `e` eager) and, for a timed replay, its
/// device time: where a run's wall time goes beyond its replays.
fn step_times(backend: &CudaBackend, model: &Arc<dyn Model>, prompt: &[u32], n: usize) -> Res<()> {
    let mut s = Session::new(model.clone(), prompt.len() + n + 1)?;
    let mut t = argmax(s.prefill(prompt, &mut |_, _| {})?) as u32;
    let mut line = String::new();
    // Wall ms of all steps, and of those not replayed and their count.
    let (mut all, mut other, mut k) = (0.0, 0.0, 0);
    for i in 0..n {
        let before = backend.stats();
        let t0 = Instant::now();
        t = argmax(s.decode(t)?) as u32;
        let wall = t0.elapsed().as_secs_f64() * 1e3;
        let after = backend.stats();
        let how = if after.graph_replays > before.graph_replays {
            'r'
        } else if after.graph_captures > before.graph_captures {
            'c'
        } else {
            'e'
        };
        let device = if after.graph_timed > before.graph_timed {
            format!("/{:.3}", after.graph_gpu_ms - before.graph_gpu_ms)
        } else {
            String::new()
        };
        line += &format!(" {i}:{wall:.3}{how}{device}");
        all += wall;
        if how != 'r' {
            other += wall;
            k += 1;
        }
    }
    println!("step times (ms wall, how, /device ms):{line}");
    println!(
        "steps: {n} in {all:.3} ms, {:.3} ms per step; {k} not replayed took {other:.3} ms",
        all / n as f64
    );
    Ok(())
}

/// A profile's kernels, slowest first, and its model parts, per token of `n`.
fn print_profile(
    name: &str,
    phase: &str,
    mut rows: Vec<ds4_cuda::ProfileRow>,
    n: usize,
    what: &str,
) {
    rows.sort_by(|a, b| b.ms.total_cmp(&a.ms));
    let total: f64 = rows.iter().map(|r| r.ms).sum();
    println!(
        "profile of {what}: {:.3} ms/token in kernels",
        total / n as f64
    );
    for r in &rows {
        let bw = if r.bytes > 0 {
            format!("{:.2} TB/s", r.bytes as f64 / (r.ms / 1e3) / 1e12)
        } else {
            String::new()
        };
        println!(
            "  {:<22} {:<24} {:>6.1} launches/token {:>9.1} us/token {:>8.2} us/launch {bw}",
            r.region,
            r.label,
            r.launches as f64 / n as f64,
            1e3 * r.ms / n as f64,
            1e3 * r.ms / r.launches as f64
        );
    }
    // Per model part (the family's regions).
    for p in ds4_cuda::by_part(&rows) {
        let (region, us, launches) = (
            p.region,
            1e3 * p.ms / n as f64,
            p.launches as f64 / n as f64,
        );
        println!("  part {region:<22} {us:>9.1} us/token {launches:>6.1} launches/token");
        println!(
            "RESULT {{\"kind\":\"part\",\"model\":\"{name}\",\"phase\":\"{phase}\",\"part\":{region:?},\"us_per_token\":{us:.2},\"launches\":{launches:.1}}}"
        );
    }
}

/// A decode kernel configuration of the backend.
#[derive(Clone, Copy)]
struct KernelConfig {
    fused_attention: bool,
    /// GEMV rows per warp prefetched into L2 ahead of the row it computes (0: only its
    /// first).
    prefetch: u32,
    /// Typed GEMV kernels for single-type launches of short rows (off: generic only).
    gemv_typed: bool,
}

impl KernelConfig {
    /// The backend's default: attention in three launches, no prefetch ahead, typed
    /// GEMV kernels.
    const DEFAULT: KernelConfig = KernelConfig {
        fused_attention: false,
        prefetch: 0,
        gemv_typed: true,
    };

    fn apply(&self, b: &CudaBackend) {
        b.set_fused_attention(self.fused_attention);
        b.set_prefetch(self.prefetch);
        b.set_gemv_typed(self.gemv_typed);
    }
}

/// The configurations `--ab` compares (`--profile` profiles the first two).
const CONFIGS: [(&str, KernelConfig); 3] = [
    ("default", KernelConfig::DEFAULT),
    (
        "generic-gemv",
        KernelConfig {
            gemv_typed: false,
            ..KernelConfig::DEFAULT
        },
    ),
    (
        "fused-attention",
        KernelConfig {
            fused_attention: true,
            ..KernelConfig::DEFAULT
        },
    ),
];

fn profile_configs(on: bool) -> Vec<(&'static str, KernelConfig)> {
    if on {
        CONFIGS[..2].to_vec()
    } else {
        Vec::new()
    }
}

/// One decode run of `n` tokens: its tokens per second and, when some of its steps were
/// timed graph replays, the device ms per replay.
fn timed_run(
    backend: &CudaBackend,
    decode_run: &dyn Fn(usize) -> Res<f64>,
    n: usize,
) -> Res<(f64, Option<f64>)> {
    let before = backend.stats();
    let tps = decode_run(n)?;
    let after = backend.stats();
    let timed = after.graph_timed - before.graph_timed;
    let ms = (timed > 0).then(|| (after.graph_gpu_ms - before.graph_gpu_ms) / timed as f64);
    Ok((tps, ms))
}

/// Decode steps of the profiled runs and the variants' warm-ups (the bench's session
/// holds at least this many).
const SHORT_RUN: usize = 16;

/// `n` greedy decode steps after a prompt, `start` run between the two: tokens per second.
type Greedy<'a> = dyn Fn(usize, &dyn Fn()) -> Res<f64> + 'a;

/// The launch labels of a decode step, from one eager profiled step.
fn profile_labels(backend: &CudaBackend, greedy: &Greedy) -> Res<Vec<&'static str>> {
    backend.set_graphs(false);
    let run = greedy(1, &|| {
        backend.set_profile(true);
        backend.take_profile();
    });
    backend.set_profile(false);
    backend.set_graphs(true);
    run?;
    let mut labels: Vec<_> = backend.take_profile().iter().map(|r| r.label).collect();
    labels.sort_unstable();
    labels.dedup();
    Ok(labels)
}

/// What each launch label costs inside a replay: the device ms per replay with every
/// launch (measured before and after the sweep) against the same with the label's
/// launches left out; two runs of `n` tokens each, after an 8-token warm-up.
fn sweep(
    name: &str,
    backend: &CudaBackend,
    n: usize,
    decode_run: &dyn Fn(usize) -> Res<f64>,
    labels: &[&'static str],
) -> Res<()> {
    let device_ms = |without: &[String]| -> Res<Vec<f64>> {
        backend.set_without(without);
        decode_run(8)?;
        (0..2)
            .map(|_| {
                timed_run(backend, decode_run, n)?.1.ok_or_else(|| {
                    "--sweep: no timed graph replay (decode at least 2 tokens)".into()
                })
            })
            .collect()
    };
    let all = device_ms(&[])?;
    let mut rows = Vec::new();
    for &l in labels {
        rows.push((l, device_ms(&[l.to_string()])?));
    }
    let all2 = device_ms(&[])?;
    let base = median(&[all.clone(), all2.clone()].concat());
    println!("sweep: every launch {all:.3?} then {all2:.3?} ms per replay");
    rows.sort_by(|a, b| median(&a.1).total_cmp(&median(&b.1)));
    for (l, v) in rows {
        let saved = base - median(&v);
        println!("  without {l:<28} {v:.3?} ms per replay: saves {saved:.3}");
        println!(
            "RESULT {{\"kind\":\"sweep\",\"model\":\"{name}\",\"label\":{l:?},\"device_ms\":{v:?},\"saved_ms\":{saved:.4}}}"
        );
    }
    Ok(())
}

/// Paired decode comparison: `rounds` rounds, each running every configuration once
/// (order reversed every other round), `n` greedy tokens per run after an 8-token
/// warm-up on the configuration; tok/s and device ms per graph replay per run.
fn ab_compare(
    name: &str,
    backend: &CudaBackend,
    rounds: usize,
    n: usize,
    decode_run: &dyn Fn(usize) -> Res<f64>,
) -> Res<()> {
    let configs = CONFIGS;
    let mut tps = vec![Vec::new(); configs.len()];
    let mut dev = vec![Vec::new(); configs.len()];
    let mut kernels = vec![0; configs.len()];
    for r in 0..rounds {
        let order: Vec<usize> = if r % 2 == 0 {
            (0..configs.len()).collect()
        } else {
            (0..configs.len()).rev().collect()
        };
        for c in order {
            configs[c].1.apply(backend);
            decode_run(8)?;
            let (t, ms) = timed_run(backend, decode_run, n)?;
            tps[c].push(t);
            dev[c].extend(ms);
            kernels[c] = backend.stats().decode_kernels;
        }
    }
    for (c, (label, _)) in configs.iter().enumerate() {
        println!(
            "ab {label}: decode median {:.1} tok/s [{:.1}, {:.1}] runs {:?}; device {:.3} ms/token [{:.3}, {:.3}]; {} kernels/token",
            median(&tps[c]),
            min(&tps[c]),
            max(&tps[c]),
            round1(&tps[c]),
            median(&dev[c]),
            min(&dev[c]),
            max(&dev[c]),
            kernels[c]
        );
        println!(
            "RESULT {{\"kind\":\"decode_ab\",\"model\":\"{name}\",\"config\":\"{label}\",\"tokens\":{n},\"tps_median\":{:.2},\"tps_runs\":{:?},\"device_ms_runs\":{:?},\"kernels_per_token\":{}}}",
            median(&tps[c]),
            round1(&tps[c]),
            dev[c]
                .iter()
                .map(|x| (x * 1e4).round() / 1e4)
                .collect::<Vec<_>>(),
            kernels[c]
        );
    }
    KernelConfig::DEFAULT.apply(backend);
    Ok(())
}

/// Single-matrix GEMV bandwidth for the llama3-8b shapes (eager launches timed with
/// events, 20 per matrix after a warm-up).
fn gemv_bench() -> Res<()> {
    use ds4_engine::backend::Backend;
    use ds4_gguf::GgmlType::{Q4_K, Q6_K, Q8_0};
    let b = CudaBackend::new(0)?;
    b.set_pdl(false);
    b.set_graphs(false);
    b.set_profile(true);
    let shapes = [
        (4096, 4096, Q4_K),
        (14336, 4096, Q4_K),
        (4096, 14336, Q6_K),
        (128256, 4096, Q6_K),
        (14336, 4096, Q8_0),
    ];
    for (rows, cols, ty, typed) in shapes
        .iter()
        .flat_map(|&(r, c, t)| [true, false].map(|v| (r, c, t, v)))
    {
        b.set_gemv_typed(typed);
        let w = b.synthetic_matrix("bench.weight", rows, cols, ty, 1)?;
        let x = b.buf(cols)?;
        let mut out = b.buf(rows)?;
        let mut v = Vec::new();
        for i in 0..21 {
            if i == 1 {
                b.take_profile();
            }
            b.step(&[0], 0)?;
            b.matmul(&w, None, &x, 1, Prec::Ggml, &mut out)?;
            v.clear();
            b.read(&out, 0, 1, &mut v)?;
        }
        let p = b.take_profile();
        let r = &p[0];
        let bytes = (cols / ty.block_size() * ty.type_size() * rows) as f64;
        println!(
            "gemv {ty} {rows}x{cols} typed {typed}: {:.2} us/launch, {:.2} TB/s ({:.1} MB)",
            1e3 * r.ms / r.launches as f64,
            bytes * r.launches as f64 / (r.ms / 1e3) / 1e12,
            bytes / 1e6
        );
    }
    Ok(())
}

fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max)
}

fn round1(v: &[f64]) -> Vec<f64> {
    v.iter().map(|x| (x * 10.0).round() / 10.0).collect()
}
