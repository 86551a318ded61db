//! GGUF files of synthetic models: the full file ([`write_gguf`], weights generated on
//! the host) and a header-only view for the GPU path ([`header_file`]).

use std::io::Write;
use std::path::Path;

use ds4_gguf::{GgmlType, GgufFile, GgufWriter, Value};

use super::{Recipe, Spec, generate};
use crate::error::{CudaError, Result};

/// llama.cpp's `llama_ftype` of the recipe (`general.file_type`).
fn file_type(r: Recipe) -> u32 {
    use GgmlType::*;
    match r {
        Recipe::Q4KM => 15,
        Recipe::Uniform(t) => match t {
            Q4_0 => 2,
            Q4_1 => 3,
            Q8_0 => 7,
            Q5_0 => 8,
            Q4_K => 14,
            Q5_K => 16,
            Q6_K => 18,
            IQ2_XXS => 19,
            _ => 0,
        },
    }
}

/// GPT-2's byte-to-unicode map: the printable character standing for each byte in
/// byte-level BPE vocabularies.
pub fn byte_to_unicode() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut extra = 0u32;
    for b in 0..256u32 {
        let printable =
            (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        out[b as usize] = if printable {
            char::from_u32(b).expect("latin-1")
        } else {
            extra += 1;
            char::from_u32(255 + extra).expect("in range")
        };
    }
    out
}

/// A byte-level vocabulary of `n` tokens: the 256 byte tokens, then `ĠĠ` (two spaces,
/// the one merge), then distinct two- and three-byte filler strings, then BOS and EOS
/// (control tokens).
fn vocab(n: usize) -> (Vec<Value>, Vec<Value>) {
    let bu = byte_to_unicode();
    let mut tokens: Vec<String> = bu.iter().map(|c| c.to_string()).collect();
    let space2 = format!("{0}{0}", bu[b' ' as usize]);
    tokens.push(space2.clone());
    let n_fill = n.saturating_sub(tokens.len() + 2);
    let mut i = 0usize;
    while tokens.len() < 257 + n_fill {
        let s: String = if i < 65536 {
            [bu[i >> 8], bu[i & 0xFF]].iter().collect()
        } else {
            let j = i - 65536;
            [bu[(j >> 16) & 0xFF], bu[(j >> 8) & 0xFF], bu[j & 0xFF]]
                .iter()
                .collect()
        };
        i += 1;
        if s != space2 {
            tokens.push(s);
        }
    }
    tokens.push("<|bos|>".into());
    tokens.push("<|eos|>".into());
    tokens.truncate(n);
    let types = (0..tokens.len())
        .map(|k| Value::I32(if k + 2 >= n { 3 } else { 1 }))
        .collect();
    (tokens.into_iter().map(Value::String).collect(), types)
}

/// The bytes of tensor (name, dims, type).
type TensorData<'a> = &'a mut dyn FnMut(&str, &[u64], GgmlType) -> Vec<u8>;

fn writer(spec: &Spec, data: TensorData) -> Result<GgufWriter> {
    let s = &spec.shape;
    let a = s.arch;
    let hd = s.n_embd / s.n_head;
    let mut w = GgufWriter::new();
    let mut md = |k: String, v: Value| w.add_metadata(k, v);
    md("general.architecture".into(), Value::String(a.into()))?;
    md(
        "general.name".into(),
        Value::String(format!("synthetic {}", spec.name())),
    )?;
    md(
        "general.file_type".into(),
        Value::U32(file_type(spec.recipe)),
    )?;
    md(format!("{a}.vocab_size"), Value::U32(s.n_vocab as u32))?;
    md(
        format!("{a}.context_length"),
        Value::U32(s.n_ctx_train as u32),
    )?;
    md(format!("{a}.embedding_length"), Value::U32(s.n_embd as u32))?;
    md(format!("{a}.block_count"), Value::U32(s.n_layer as u32))?;
    md(
        format!("{a}.feed_forward_length"),
        Value::U32(s.n_ff as u32),
    )?;
    md(
        format!("{a}.attention.head_count"),
        Value::U32(s.n_head as u32),
    )?;
    md(
        format!("{a}.attention.head_count_kv"),
        Value::U32(s.n_head_kv as u32),
    )?;
    md(format!("{a}.rope.dimension_count"), Value::U32(hd as u32))?;
    md(format!("{a}.rope.freq_base"), Value::F32(s.rope_base))?;
    md(
        format!("{a}.attention.layer_norm_rms_epsilon"),
        Value::F32(s.eps),
    )?;
    let (tokens, types) = vocab(s.n_vocab);
    md("tokenizer.ggml.model".into(), Value::String("gpt2".into()))?;
    md("tokenizer.ggml.pre".into(), Value::String("default".into()))?;
    md("tokenizer.ggml.tokens".into(), Value::Array(tokens))?;
    md("tokenizer.ggml.token_type".into(), Value::Array(types))?;
    let sp = byte_to_unicode()[b' ' as usize];
    md(
        "tokenizer.ggml.merges".into(),
        Value::Array(vec![Value::String(format!("{sp} {sp}"))]),
    )?;
    md(
        "tokenizer.ggml.bos_token_id".into(),
        Value::U32(s.n_vocab as u32 - 2),
    )?;
    md(
        "tokenizer.ggml.eos_token_id".into(),
        Value::U32(s.n_vocab as u32 - 1),
    )?;
    md(
        "tokenizer.ggml.add_bos_token".into(),
        Value::Bool(a == "llama"),
    )?;
    for (name, dims, ty) in spec.tensors() {
        let bytes = data(&name, &dims, ty);
        w.add_tensor(name, &dims, ty, bytes)?;
    }
    Ok(w)
}

/// Writes `spec` as a GGUF file at `path` (weights generated on the host; the same
/// bytes [`crate::CudaBackend::synthetic`] generates on the GPU).
pub fn write_gguf(spec: &Spec, path: &Path) -> Result<()> {
    let seed = spec.seed;
    let w = writer(spec, &mut |name, dims, ty| {
        if ty == GgmlType::F32 {
            let v = generate::vector(seed, name, dims.iter().product::<u64>() as usize);
            v.iter().flat_map(|x| x.to_le_bytes()).collect()
        } else {
            let n_blocks = dims.iter().product::<u64>() as usize / ty.block_size();
            generate::blocks(ty, generate::tensor_key(seed, name), n_blocks)
        }
    })?;
    w.write_file(path)?;
    Ok(())
}

/// Keeps the first `keep` bytes written and counts the rest without reading them.
struct Prefix {
    keep: usize,
    bytes: Vec<u8>,
}

impl Write for Prefix {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let room = self.keep.saturating_sub(self.bytes.len());
        self.bytes.extend_from_slice(&buf[..room.min(buf.len())]);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The GGUF of `spec` with its tensor directory but no weights: a sparse temporary file
/// (removed once mapped) whose data section reads as zeros. For
/// [`crate::CudaBackend::synthetic`], which generates the weights on the device from
/// the tensor names.
pub fn header_file(spec: &Spec) -> Result<GgufFile> {
    // Zeroed vectors are lazily mapped pages: nothing is touched or written.
    let w = writer(spec, &mut |_, dims, ty| {
        vec![0u8; (dims.iter().product::<u64>() as usize / ty.block_size()) * ty.type_size()]
    })?;
    let align = w.alignment();
    let data_len = w.tensor_infos().last().map_or(0, |t| {
        t.offset + t.try_n_bytes().unwrap_or(0).next_multiple_of(align)
    });
    let mut counter = Prefix {
        keep: usize::MAX,
        bytes: Vec::new(),
    };
    // First pass: the total length, to find where the data section starts.
    let total = {
        let mut c = Prefix {
            keep: 0,
            bytes: Vec::new(),
        };
        w.write_to(&mut c)?
    };
    counter.keep = (total - data_len) as usize;
    w.write_to(&mut counter)?;
    let path = std::env::temp_dir().join(format!(
        "ds4-synth-{}-{}.gguf",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    let io = |e| CudaError::Io {
        path: path.display().to_string(),
        source: e,
    };
    {
        let mut f = std::fs::File::create(&path).map_err(io)?;
        f.write_all(&counter.bytes).map_err(io)?;
        f.set_len(total).map_err(io)?;
    }
    let file = GgufFile::open(&path);
    let _ = std::fs::remove_file(&path);
    Ok(file?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_is_gpt2s() {
        let bu = byte_to_unicode();
        assert_eq!(bu[b'a' as usize], 'a');
        assert_eq!(bu[b' ' as usize], 'Ġ');
        assert_eq!(bu[b'\n' as usize], 'Ċ');
        assert_eq!(bu[0], 'Ā');
        let mut all: Vec<char> = bu.to_vec();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 256);
    }

    #[test]
    fn vocab_has_the_size_and_distinct_tokens() {
        for n in [1536, 70000] {
            let (t, ty) = vocab(n);
            assert_eq!(t.len(), n);
            assert_eq!(ty.len(), n);
            let mut s: Vec<&str> = t.iter().map(|v| v.as_str().unwrap()).collect();
            s.sort();
            s.dedup();
            assert_eq!(s.len(), n);
        }
    }

    #[test]
    fn header_file_matches_the_full_file() {
        let spec = Spec::parse("tiny-qwen2:q4_k").unwrap();
        let dir = std::env::temp_dir().join(format!("ds4-cuda-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let full_path = dir.join("full.gguf");
        write_gguf(&spec, &full_path).unwrap();
        let full = GgufFile::open(&full_path).unwrap();
        let head = header_file(&spec).unwrap();
        assert_eq!(full.tensors(), head.tensors());
        assert_eq!(full.data_offset(), head.data_offset());
        assert_eq!(full.as_bytes().len(), head.as_bytes().len());
        assert_eq!(
            full.as_bytes()[..full.data_offset() as usize],
            head.as_bytes()[..head.data_offset() as usize]
        );
        // The full file's blocks are the generator's.
        let t = full.tensor("blk.1.ffn_up.weight").unwrap();
        let n_blocks = (t.n_elements() / 256) as usize;
        assert_eq!(
            full.tensor_data(t),
            &generate::blocks(
                GgmlType::Q4_K,
                generate::tensor_key(spec.seed, &t.name),
                n_blocks
            )[..]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
