//! Either model family behind one type ([`AnyLm`]), as the stages hold it: the one place that
//! names both rla-pipe's small transformer and the pretrained Hugging Face decoders.

use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor};

use super::hf::CausalLm;
use super::lm::{KvCache, Lm};
use super::transformer::Transformer;

/// Either model family, as the stages hold it (one per stage: the size of the enum is
/// immaterial next to the weights behind it).
#[allow(clippy::large_enum_variant)]
#[derive(burn::module::Module, Debug)]
pub enum AnyLm<B: Backend> {
    /// rla-pipe's small transformer.
    Small(Transformer<B>),
    /// A pretrained Hugging Face decoder.
    Hf(CausalLm<B>),
}

impl<B: Backend> Lm<B> for AnyLm<B> {
    fn hidden(
        &self,
        tokens: Tensor<B, 2, Int>,
        positions: Tensor<B, 2, Int>,
        mask: Tensor<B, 3, Bool>,
        cache: Option<&mut KvCache<B>>,
    ) -> Tensor<B, 3> {
        match self {
            AnyLm::Small(m) => Lm::hidden(m, tokens, positions, mask, cache),
            AnyLm::Hf(m) => Lm::hidden(m, tokens, positions, mask, cache),
        }
    }

    fn head(&self, hidden: Tensor<B, 2>) -> Tensor<B, 2> {
        match self {
            AnyLm::Small(m) => Lm::head(m, hidden),
            AnyLm::Hf(m) => Lm::head(m, hidden),
        }
    }

    fn vocab(&self) -> usize {
        match self {
            AnyLm::Small(m) => Lm::vocab(m),
            AnyLm::Hf(m) => Lm::vocab(m),
        }
    }

    fn context(&self) -> usize {
        match self {
            AnyLm::Small(m) => Lm::context(m),
            AnyLm::Hf(m) => Lm::context(m),
        }
    }

    fn packs_prefixes(&self) -> bool {
        match self {
            AnyLm::Small(m) => Lm::packs_prefixes(m),
            AnyLm::Hf(m) => Lm::packs_prefixes(m),
        }
    }
}
