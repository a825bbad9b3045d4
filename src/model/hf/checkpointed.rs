//! Per-layer activation checkpointing (`update.checkpoint_layers`, by default on `cuda`): a
//! training call keeps each layer's input `[b, t, hidden]` and nothing else of its layers,
//! instead of an autodiff graph per layer that holds every activation its backward pass reads
//! (the normed inputs, q/k/v, the attention's output, the MLP's `[b, t, intermediate]` products
//! and its activation: about 9,000 f32 a token and layer for SmolLM2-135M with the GPU's
//! kernels, 36 KB, against the 576 of the layer's input; with one backward pass per minibatch on
//! a GPU, thousands of tokens over 30 layers).
//!
//! The forward pass runs the layers untracked (a copy of the model whose parameters need no
//! gradient: the same operations, so the same values as a tracked forward) and makes the last
//! layer's output a leaf of the loss's graph, so the final norm, the head and the loss are
//! differentiated as before. The layers' backward pass is deferred ([`crate::model::tape`]): once
//! the loss's backward pass has given that leaf's gradient, each layer is run again from its kept
//! input, tracked, from the last to the first, and differentiated alone (`Σ y ⊙ dy`, whose
//! gradient with respect to `y` is `dy` exactly), handing its input's gradient to the layer below;
//! the embeddings take the first layer's. So the update holds the layers' inputs of its
//! micro-batch's calls and one layer's graph at a time, for one more forward pass of the
//! layers. The gradients are the plain graph's up to the order in which a parameter's gradients
//! from several calls are summed (`prefix::checkpointed_layers_train_as_the_plain_graph`).

use burn::module::Module;
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Bool, Int, Tensor};
use std::any::Any;

use super::arch::{Call, CausalLm, KvCache};
use crate::model::lm::Lm;
use crate::model::tape;

/// A pretrained decoder as the one interface the stages use: its calls as [`CausalLm`]'s own,
/// but for a training call without a cache while an update records its micro-batch, which is
/// checkpointed (this module).
impl<B: Backend> Lm<B> for CausalLm<B> {
    fn hidden(
        &self,
        tokens: Tensor<B, 2, Int>,
        positions: Tensor<B, 2, Int>,
        mask: Tensor<B, 3, Bool>,
        cache: Option<&mut KvCache<B>>,
    ) -> Tensor<B, 3> {
        if cache.is_some() || self.packed.is_some() {
            return CausalLm::hidden(self, tokens, positions, mask, cache);
        }
        match hidden(self, tokens, positions, mask) {
            Ok(x) => x,
            Err((tokens, positions, mask)) => CausalLm::hidden(self, tokens, positions, mask, None),
        }
    }

    fn head(&self, hidden: Tensor<B, 2>) -> Tensor<B, 2> {
        CausalLm::head(self, hidden)
    }

    fn vocab(&self) -> usize {
        self.arch.vocab
    }

    fn packs_prefixes(&self) -> bool {
        true
    }

    /// `max_position_embeddings` (RoPE has no table; without the key, 1 << 20).
    fn context(&self) -> usize {
        self.arch.max_positions.unwrap_or(1 << 20)
    }
}

/// A call's inputs, handed back when it is not checkpointed.
type Inputs<B> = (Tensor<B, 2, Int>, Tensor<B, 2, Int>, Tensor<B, 3, Bool>);

/// [`CausalLm::hidden`] of a call without a cache, checkpointed when this thread records an
/// update's micro-batch ([`tape::record`]) on a training backend; otherwise its inputs back.
fn hidden<B: Backend>(
    m: &CausalLm<B>,
    tokens: Tensor<B, 2, Int>,
    positions: Tensor<B, 2, Int>,
    mask: Tensor<B, 3, Bool>,
) -> Result<Tensor<B, 3>, Inputs<B>> {
    if !tape::recording() || !B::ad_enabled(&tokens.device()) {
        return Err((tokens, positions, mask));
    }
    /// The call on training backend `$a` when `B` is it.
    macro_rules! on {
        ($inputs:expr, $a:ty) => {{
            let inputs = $inputs;
            if let Some(m) = (m as &dyn Any).downcast_ref::<CausalLm<$a>>() {
                let inputs = crate::model::backend::cast::<Inputs<B>, Inputs<$a>>(inputs)
                    .unwrap_or_else(|_| unreachable!("the model's backend is the inputs'"));
                let (tokens, positions, mask) = inputs;
                return Ok(crate::model::backend::cast_back(run(
                    m, tokens, positions, mask,
                )));
            }
            inputs
        }};
    }
    let inputs = on!((tokens, positions, mask), crate::model::backend::CpuTrain);
    #[cfg(feature = "cuda")]
    let inputs = on!(inputs, crate::model::backend::GpuTrain);
    #[cfg(feature = "cuda")]
    let inputs = on!(inputs, crate::model::backend::GpuTrainBalanced);
    #[cfg(feature = "ndarray")]
    let inputs = on!(inputs, burn::backend::Autodiff<burn::backend::NdArray>);
    Err(inputs)
}

/// The checkpointed call: the layers untracked, their inputs kept, the last one's output a
/// leaf; the layers' backward pass left on the tape.
fn run<A: AutodiffBackend>(
    m: &CausalLm<A>,
    tokens: Tensor<A, 2, Int>,
    positions: Tensor<A, 2, Int>,
    mask: Tensor<A, 3, Bool>,
) -> Tensor<A, 3> {
    let [b, t] = tokens.dims();
    let call = m.call(positions, mask, b, t, None);
    // The layers the deferred pass runs: from the lowest with a trained parameter up (with
    // adapters on the top layers only, the layers below them get no gradient, as in burn's
    // graph, which tracks nothing below them); all of them when the embeddings train.
    let embeddings = m.model.embed_tokens.weight.val().is_require_grad();
    let lowest = match embeddings {
        true => 0,
        false => m
            .model
            .layers
            .iter()
            .position(trains)
            .unwrap_or(m.model.layers.len()),
    };
    // The same parameters (their storage shared), none of them tracked.
    let still = m.clone().no_grad();
    let mut x = still.embed(tokens.clone());
    let mut inputs = Vec::with_capacity(m.model.layers.len() - lowest);
    for l in 0..m.model.layers.len() {
        let (y, _) = still.layer(l, x.clone(), &call, None);
        if l >= lowest {
            inputs.push(x);
        }
        x = y;
    }
    drop(still);
    let last = x.require_grad();
    let out = m.final_norm(last.clone());
    let m = m.clone();
    tape::defer(Box::new(move |grads: &mut dyn Any| {
        let grads = grads
            .downcast_mut::<A::Gradients>()
            .expect("the gradients of the call's training backend");
        let pass = Pass {
            m: &m,
            call: &call,
            lowest,
            embeddings,
        };
        pass.backward(tokens, inputs, &last, grads)
    }));
    out
}

/// Whether any of a module's float parameters is trained (needs a gradient).
fn trains<A: AutodiffBackend, M: Module<A>>(module: &M) -> bool {
    struct Trains(bool);
    impl<A: AutodiffBackend> burn::module::ModuleVisitor<A> for Trains {
        fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<A, D>>) {
            self.0 |= param.val().is_require_grad();
        }
    }
    let mut v = Trains(false);
    module.visit(&mut v);
    v.0
}

/// A checkpointed call's deferred pass.
struct Pass<'a, A: AutodiffBackend> {
    m: &'a CausalLm<A>,
    call: &'a Call<A>,
    /// The first layer it runs (its input kept first).
    lowest: usize,
    /// Whether the embeddings train.
    embeddings: bool,
}

impl<A: AutodiffBackend> Pass<'_, A> {
    /// Each layer again from its input, tracked, last to `lowest`, differentiated alone with
    /// its output's gradient; then the embeddings, when they train. Each part holds one
    /// layer's (or the embeddings') parameters' gradients.
    fn backward(
        &self,
        tokens: Tensor<A, 2, Int>,
        mut inputs: Vec<Tensor<A, 3>>,
        last: &Tensor<A, 3>,
        grads: &mut A::Gradients,
    ) -> Vec<GradientsParams> {
        let layers = &self.m.model.layers;
        let mut parts = Vec::with_capacity(inputs.len() + 1);
        // A call whose output the loss does not read has no gradient.
        let Some(mut dy) = last.grad_remove(grads) else {
            return parts;
        };
        for l in (self.lowest..layers.len()).rev() {
            let x = inputs.pop().expect("an input per layer run");
            // The input's gradient, for the layer below or the embeddings.
            let below = l > self.lowest || self.embeddings;
            let x = if below { x.require_grad() } else { x };
            let (y, _) = self.m.layer(l, x.clone(), self.call, None);
            let mut g = (y * Tensor::from_inner(dy.clone())).sum().backward();
            if below {
                dy = x
                    .grad_remove(&mut g)
                    .expect("a layer's output depends on its input");
            }
            parts.push(GradientsParams::from_grads(g, &layers[l]));
        }
        if self.embeddings {
            let embed = &self.m.model.embed_tokens;
            let g = (self.m.embed(tokens) * Tensor::from_inner(dy))
                .sum()
                .backward();
            parts.push(GradientsParams::from_grads(g, embed));
        }
        parts
    }
}
