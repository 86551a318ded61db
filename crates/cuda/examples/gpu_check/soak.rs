//! `gpu_check soak SPEC [--minutes M] [--ctx N] [--every S] [--max-growth MIB]`: a
//! synthetic model decoding without pause, with rewinds (inside and beyond the KDA rewind
//! window), snapshots restored and the session reset near its context, while the GPU's
//! memory is sampled every S seconds: the device's use, and the live allocations and
//! reserved bytes of the memory pool the backend allocates from. Memory that grows with
//! the work (a leaked scratch or graph, a snapshot never freed) raises the floor of the
//! live allocations: their least sample in the second half of the run (from the first
//! sample after the first reset) against the least in the first half. Memory a session
//! holds for a while and gives back (DeepSeek-V4's prefill-end anchors, a few hundred MiB
//! after a re-evaluation) moves single samples, not the floor. The command prints the
//! samples, the floor's growth and the last sample's, and exits 1 on a failed step or
//! (with `--max-growth`) when the floor grew by more than MIB.

use std::time::{Duration, Instant};

use ds4_cuda::load_synthetic;
use ds4_cuda::parity::{argmax, test_tokens};
use ds4_cuda::synth::Spec;
use ds4_cuda::synth::generate::splitmix64;
use ds4_engine::Session;

use crate::Res;

/// One memory sample, MiB.
#[derive(Clone, Copy)]
struct Mem {
    device: f64,
    live: f64,
    reserved: f64,
}

/// What the loop did, for the summary line.
#[derive(Default)]
struct Counts {
    tokens: u64,
    prompts: u64,
    rewinds: u64,
    restores: u64,
    resets: u64,
}

pub(crate) fn soak(args: &[String]) -> Res<()> {
    let name = args.first().ok_or("soak needs a synthetic model name")?;
    let (mut minutes, mut ctx, mut every) = (30.0f64, 8192usize, 30.0f64);
    let mut max_growth: Option<f64> = None;
    let mut i = 1;
    while i < args.len() {
        let v = args.get(i + 1).ok_or("an option without its value")?;
        match args[i].as_str() {
            "--minutes" => minutes = v.parse()?,
            "--ctx" => ctx = v.parse()?,
            "--every" => every = v.parse()?,
            "--max-growth" => max_growth = Some(v.parse()?),
            a => return Err(format!("unknown option {a}").into()),
        }
        i += 2;
    }
    if ctx < 1024 {
        return Err("--ctx must be at least 1024".into());
    }
    let spec = Spec::parse(name)?;
    let syn = load_synthetic(&spec, 0)?;
    let (backend, model) = (syn.backend, syn.model);
    let n_vocab = model.info().n_vocab;
    // MiB in use on the device, in the pool's live allocations, reserved by the pool.
    let used = || -> Res<Mem> {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let (free, total) = backend.gpu().mem_info()?;
        let (live, reserved) = backend.gpu().pool_usage()?;
        Ok(Mem {
            device: mib((total - free) as u64),
            live: mib(live),
            reserved: mib(reserved),
        })
    };
    println!(
        "soak {name}: {minutes} min, context {ctx}, GPU memory sampled every {every} s; {:.0} MiB used after loading",
        used()?.device
    );
    let mut s = Session::new(model.clone(), ctx)?;
    let mut c = Counts::default();
    let mut seed = 1u64;
    let mut rand = |n: u64| {
        seed = splitmix64(seed);
        seed % n
    };
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs_f64(minutes * 60.0);
    let mut next_sample = t0;
    let mut samples: Vec<(f64, Mem, u64)> = Vec::new();
    let mut t = 0u32;
    while Instant::now() < end {
        if s.tokens().len() + 600 > ctx {
            s.reset()?;
            c.resets += 1;
        }
        if s.tokens().is_empty() {
            let prompt = test_tokens(16 + rand(496) as usize, n_vocab, c.prompts + 7);
            t = argmax(s.prefill(&prompt, &mut |_, _| {})?) as u32;
            c.prompts += 1;
        }
        // A reply, then a rewind of 1..=40 tokens (the KDA window is 16: beyond it the
        // session re-evaluates from its nearest rewind point); every eighth round a
        // snapshot taken before the reply is restored instead.
        let snap = (rand(8) == 0).then(|| s.snapshot()).transpose()?;
        for _ in 0..8 + rand(120) {
            t = argmax(s.decode(t)?) as u32;
            c.tokens += 1;
        }
        if let Some(snap) = snap {
            s.restore(&snap)?;
            t = argmax(s.logits().ok_or("a snapshot without logits")?) as u32;
            c.restores += 1;
        } else {
            // Back to `keep` tokens: rewind one further and decode the last kept token
            // again, which gives the logits to continue from.
            let keep = s
                .tokens()
                .len()
                .saturating_sub(1 + rand(40) as usize)
                .max(1);
            let last = s.tokens()[keep - 1];
            s.rewind(keep - 1)?;
            t = argmax(s.decode(last)?) as u32;
            c.rewinds += 1;
        }
        if Instant::now() >= next_sample {
            let (at, m) = (t0.elapsed().as_secs_f64(), used()?);
            println!(
                "t {at:7.1} s  device {:9.1} MiB  pool live {:9.1} reserved {:9.1}  length {}  tokens {}  rewinds {}  restores {}  resets {}",
                m.device,
                m.live,
                m.reserved,
                s.tokens().len(),
                c.tokens,
                c.rewinds,
                c.restores,
                c.resets
            );
            samples.push((at, m, c.resets));
            next_sample += Duration::from_secs_f64(every);
        }
    }
    // Samples from the first after the session first reached its context and started
    // over (every buffer sized by the context, and scratch sized by the largest call, is
    // in place by then; without a reset, after the first minute): the growth of the floor
    // of the pool's live allocations (a leak) and of the device's use (with the blocks the
    // pool keeps), and the last sample's growth.
    let from = samples
        .iter()
        .position(|s| s.2 > 0)
        .or(samples.iter().position(|s| s.0 >= 60.0))
        .unwrap_or(0);
    let warm = samples.get(from).copied().ok_or("no memory sample")?;
    let late = &samples[from..];
    let (first, second) = match late.split_at(late.len() / 2) {
        ([], _) => (late, late),
        halves => halves,
    };
    let floor = |v: &[(f64, Mem, u64)], f: fn(&Mem) -> f64| {
        v.iter().map(|s| f(&s.1)).fold(f64::INFINITY, f64::min)
    };
    let growth = floor(second, |m| m.live) - floor(first, |m| m.live);
    let device_growth = floor(second, |m| m.device) - floor(first, |m| m.device);
    let last = samples.last().ok_or("no memory sample")?.1;
    let max = samples.iter().map(|s| s.1.device).fold(0.0, f64::max);
    let st = backend.stats();
    println!(
        "soak done: {:.1} min, {} tokens decoded ({} graph replays), {} prompts, {} rewinds, {} restores, {} resets; from {:.0} s: floor of the pool's live allocations {:+.1} MiB, of the device's use {:+.1} MiB; last sample: pool live {:.1} -> {:.1} MiB, device {:.1} -> {:.1} MiB (max {:.1})",
        t0.elapsed().as_secs_f64() / 60.0,
        c.tokens,
        st.graph_replays,
        c.prompts,
        c.rewinds,
        c.restores,
        c.resets,
        warm.0,
        growth,
        device_growth,
        warm.1.live,
        last.live,
        warm.1.device,
        last.device,
        max
    );
    println!(
        "RESULT {{\"kind\":\"soak\",\"model\":\"{name}\",\"minutes\":{:.2},\"tokens\":{},\"rewinds\":{},\"restores\":{},\"resets\":{},\"live_floor_growth_mib\":{:.1},\"device_floor_growth_mib\":{:.1},\"live_last_growth_mib\":{:.1},\"device_max_mib\":{max:.1}}}",
        t0.elapsed().as_secs_f64() / 60.0,
        c.tokens,
        c.rewinds,
        c.restores,
        c.resets,
        growth,
        device_growth,
        last.live - warm.1.live
    );
    if let Some(bound) = max_growth
        && growth > bound
    {
        return Err(format!(
            "the floor of the live allocations grew by {growth:.1} MiB (bound {bound} MiB)"
        )
        .into());
    }
    Ok(())
}
