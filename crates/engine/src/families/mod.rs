//! Model families, one file each, readable beside the reference they follow.

#[cfg(test)]
mod bounds;
pub mod deepseek4;
pub mod glm5_next;
pub mod llama;
mod state_file;

use std::collections::VecDeque;

use crate::Result;
use crate::backend::Backend;
use crate::model::Logits;

/// The tokens of a forward call: given by the host, or the one token the sequence's last
/// greedy choice picked, still on the backend ([`Logits::Pick`],
/// [`crate::Model::forward_picked`]).
#[derive(Clone, Copy)]
pub(crate) enum Tokens<'a> {
    Given(&'a [u32]),
    Picked,
}

impl<'a> Tokens<'a> {
    pub(crate) fn len(self) -> usize {
        match self {
            Tokens::Given(t) => t.len(),
            Tokens::Picked => 1,
        }
    }

    /// The ids the host knows (none for a picked token, which the backend chose from the
    /// vocabulary's logits).
    pub(crate) fn given(self) -> &'a [u32] {
        match self {
            Tokens::Given(t) => t,
            Tokens::Picked => &[],
        }
    }

    /// Refuses tokens that do not fit after the `len` held in a context of `capacity`, or
    /// a given id outside a vocabulary of `n_vocab`.
    pub(crate) fn check(self, len: usize, capacity: usize, n_vocab: usize) -> Result<()> {
        if len + self.len() > capacity {
            return Err(crate::EngineError::ContextFull {
                needed: len + self.len(),
                n_ctx: capacity,
            });
        }
        match self.given().iter().find(|&&t| t as usize >= n_vocab) {
            Some(&id) => Err(crate::EngineError::BadToken { id, n_vocab }),
            None => Ok(()),
        }
    }

    /// Consecutive pieces of at most `n` tokens, each with what it asks of a call that
    /// asks for `want`: the last row (or its choice) in the last piece alone.
    pub(crate) fn pieces(self, n: usize, want: Logits) -> Vec<(Tokens<'a>, Logits)> {
        let pieces: Vec<_> = match self {
            Tokens::Given(t) => t.chunks(n.max(1)).map(Tokens::Given).collect(),
            Tokens::Picked => vec![Tokens::Picked],
        };
        let last = pieces.len().saturating_sub(1);
        pieces
            .into_iter()
            .enumerate()
            .map(|(i, piece)| match want {
                Logits::Last | Logits::Pick if i != last => (piece, Logits::None),
                other => (piece, other),
            })
            .collect()
    }

    /// The backend's step for these tokens at `pos0`.
    pub(crate) fn step<B: Backend>(self, b: &B, picks: &Picks<B>, pos0: usize) -> Result<B::Step> {
        match self {
            Tokens::Given(t) => b.step(t, pos0),
            Tokens::Picked => b.step_picked(picks.last()?, pos0),
        }
    }
}

/// A sequence's greedy choices the host has not read yet, oldest first (pipelined greedy
/// decoding holds at most two: the step being read and the one queued after it).
pub(crate) struct Picks<B: Backend>(VecDeque<B::Pick>);

impl<B: Backend> Default for Picks<B> {
    fn default() -> Self {
        Picks(VecDeque::new())
    }
}

impl<B: Backend> Picks<B> {
    fn last(&self) -> Result<&B::Pick> {
        self.0.back().ok_or_else(|| {
            crate::EngineError::Backend(
                "a step of the previous greedy choice, but the sequence has made none".into(),
            )
        })
    }

    /// Forgets every choice not read (a truncation undoes their steps).
    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }

    /// The oldest choice, read from the backend.
    pub(crate) fn take(&mut self, b: &B) -> Result<u32> {
        let p = self.0.pop_front().ok_or_else(|| {
            crate::EngineError::Backend("no greedy choice of this sequence to take".into())
        })?;
        b.take_pick(p)
    }

    /// Hands the logits rows `rows` in `logits` on as `want` asks: read back into `out`,
    /// or ([`Logits::Pick`]: one row, the step's last) chosen on the backend.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn emit(
        &mut self,
        b: &B,
        step: &B::Step,
        want: Logits,
        logits: &B::Buf,
        rows: usize,
        n_vocab: usize,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        if want == Logits::Pick {
            debug_assert_eq!(rows, 1, "a pick is of the step's last row alone");
            self.0.push_back(b.pick(step, logits, n_vocab)?);
            return Ok(());
        }
        b.read(logits, 0, rows * n_vocab, out)
    }
}
