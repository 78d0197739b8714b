//! Batched key/value cache for incremental decoding.
//!
//! One `[batch, kv_heads, capacity, head_dim]` buffer per layer for keys and one for values,
//! written in place (see [`write_slots`]: a plain `slice_assign` copies the whole buffer on
//! the flex backend). Capacity grows by doubling, so a long generation copies each slot O(1)
//! times on average instead of once per step as a `cat`-based cache would, and never past the
//! slots the generation can fill ([`KvCache::with_limit`]): past a quarter of them it grows to
//! all of them at once. Growing and dropping rows replace one layer's buffers at a time, so
//! either holds one layer's old buffers beside the cache.

use burn::tensor::{Int, Tensor, TensorCreationOptions, TensorData, backend::Backend};

use crate::backend::attention::{SharedKeys, cache_dtype};
use crate::backend::flex_fast::write_slots;
use crate::dtype::{ComputeDtype, Dtype};

#[derive(Debug)]
struct LayerKv<B: Backend> {
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
}

impl<B: Backend> LayerKv<B> {
    /// The rows `rows` (in that order; a row may repeat) in buffers of their own.
    fn rows(&self, rows: &[usize]) -> Self {
        // One row fanned out: a repeat, whose gradient is a sum over the copies (a selection's
        // is a scatter, element by element on the CPU backend).
        if self.k.dims()[0] == 1 && rows.iter().all(|&r| r == 0) {
            return LayerKv {
                k: self.k.clone().repeat_dim(0, rows.len()),
                v: self.v.clone().repeat_dim(0, rows.len()),
            };
        }
        let idx = Tensor::<B, 1, Int>::from_data(
            TensorData::new(rows.iter().map(|&r| r as i64).collect::<Vec<_>>(), [rows.len()]),
            &self.k.device(),
        );
        LayerKv { k: self.k.clone().select(0, idx.clone()), v: self.v.clone().select(0, idx) }
    }
}

/// Keys and values of every layer for a batch of sequences.
#[derive(Debug)]
pub struct KvCache<B: Backend> {
    layers: Vec<Option<LayerKv<B>>>,
    /// Slots filled so far (identical for all rows; see [`super::layout`]).
    len: usize,
    reserve: usize,
    /// Slots a generation can fill at most: growth stops there (a doubling past it would be
    /// memory no token uses).
    limit: usize,
    /// Whether only sampling reads it ([`Self::for_sampling`]).
    sampling: bool,
    /// Rows that hold copies of another row's first slots (a prompt fanned out to its samples),
    /// which decoding's attention reads from that row.
    shared: Option<SharedKeys>,
}

impl<B: Backend> KvCache<B> {
    /// An empty cache for `num_layers` layers that pre-allocates room for `reserve` slots.
    pub fn new(num_layers: usize, reserve: usize) -> Self {
        let layers = (0..num_layers).map(|_| None).collect();
        KvCache { layers, len: 0, reserve, limit: usize::MAX, sampling: false, shared: None }
    }

    /// This cache growing to at most `limit` slots (the longest prompt plus the new tokens).
    pub fn with_limit(self, limit: usize) -> Self {
        KvCache { limit, ..self }
    }

    /// This cache read only by sampling: its keys and values are kept in the attention's dtype
    /// on the CPU too (bf16: half the bytes decoding's attention reads), where scoring's and
    /// training's stay f32 ([`cache_dtype`]). Sampling's tokens are drawn from the rounded
    /// keys, as on a GPU; no log-probability a loss reads comes from them.
    pub fn for_sampling(self) -> Self {
        KvCache { sampling: true, ..self }
    }

    /// The dtype this cache keeps its keys and values in, for a model computing in `compute`.
    pub(crate) fn dtype(&self, compute: ComputeDtype) -> Dtype {
        if self.sampling { compute.attention() } else { cache_dtype::<B>(compute) }
    }

    /// Which rows hold copies of another row's first slots, if any do.
    pub(crate) fn shared_keys(&self) -> Option<&SharedKeys> {
        self.shared.as_ref()
    }

    /// What [`Self::shared_keys`] becomes for the rows `rows` of this cache: where a row
    /// repeats (a fan-out), rows copied from one row share every slot written so far and
    /// nothing else is shared; otherwise (rows dropped or reordered) each keeps what it shared.
    fn shared_in(&self, rows: &[usize]) -> Option<SharedKeys> {
        // Grouped by the rows they copy, rows share only where one repeats. An empty cache has
        // nothing to share, before or after.
        SharedKeys::grouped(self.len, rows.iter().copied()).or_else(|| self.shared.as_ref()?.rows(rows))
    }

    /// Slots already written.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Marks `n` more slots as written (called once per forward pass, after all layers).
    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }

    /// Writes the new keys/values `[batch, kv_heads, t, head_dim]` of `layer` at slot `start`
    /// (the buffers take their dtype) and returns views of all keys and values
    /// `[batch, kv_heads, start + t, head_dim]`.
    pub(crate) fn append(
        &mut self,
        layer: usize,
        start: usize,
        k_new: Tensor<B, 4>,
        v_new: Tensor<B, 4>,
    ) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let (dims, dtype, device) = (k_new.dims(), k_new.dtype(), k_new.device());
        self.write(layer, start, dims, (&device, dtype), |k, v| {
            (write_slots(k, start, k_new), write_slots(v, start, v_new))
        })
    }

    /// The slots `layer`'s buffers hold once `end` are written: their capacity, grown as
    /// [`Self::write`] grows it.
    pub(crate) fn capacity_for(&self, layer: usize, end: usize) -> usize {
        match &self.layers[layer] {
            None => end.max(self.reserve),
            Some(kv) => {
                let cap = kv.k.dims()[2];
                // Doubling, except that a buffer past a quarter of the limit grows to the limit
                // at once: the buffer it grows from is then the reserve or at most half the
                // limit, which the memory plan counts beside it.
                let doubled = if cap.saturating_mul(4) <= self.limit { cap * 2 } else { self.limit };
                if end > cap { doubled.max(end) } else { cap }
            }
        }
    }

    /// Hands `fill` the key and value buffers of `layer` (`[batch, kv_heads, capacity,
    /// head_dim]`, created in `dtype` or grown to hold the `t` slots of `[b, h, t, d]` from
    /// `start`), which writes the new slots into them and gives them back; returns views of all
    /// keys and values `[batch, kv_heads, start + t, head_dim]`.
    pub(crate) fn write(
        &mut self,
        layer: usize,
        start: usize,
        [b, h, t, d]: [usize; 4],
        (device, dtype): (&B::Device, burn::tensor::DType),
        fill: impl FnOnce(Tensor<B, 4>, Tensor<B, 4>) -> (Tensor<B, 4>, Tensor<B, 4>),
    ) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let end = start + t;
        // Slots written again need not be alike any more.
        if let Some(shared) = &mut self.shared {
            shared.slots = shared.slots.min(start);
        }
        let cap = self.capacity_for(layer, end);
        let options = || TensorCreationOptions::new(device.clone()).with_dtype(dtype);
        let kv = match self.layers[layer].take() {
            None => {
                LayerKv { k: Tensor::zeros([b, h, cap, d], options()), v: Tensor::zeros([b, h, cap, d], options()) }
            }
            Some(kv) if kv.k.dims()[2] < cap => {
                let grow = cap - kv.k.dims()[2];
                LayerKv {
                    k: Tensor::cat(vec![kv.k, Tensor::zeros([b, h, grow, d], options())], 2),
                    v: Tensor::cat(vec![kv.v, Tensor::zeros([b, h, grow, d], options())], 2),
                }
            }
            Some(kv) => kv,
        };
        let (k, v) = fill(kv.k, kv.v);
        let out = (k.clone().slice([0..b, 0..h, 0..end, 0..d]), v.clone().slice([0..b, 0..h, 0..end, 0..d]));
        self.layers[layer] = Some(LayerKv { k, v });
        out
    }

    /// Stacks caches of the same length along the batch (prefill runs in chunks of prompts).
    pub fn concat(mut caches: Vec<Self>) -> Self {
        if caches.len() == 1 {
            return caches.pop().expect("one cache");
        }
        let len = caches[0].len;
        assert!(caches.iter().all(|c| c.len == len), "caches must hold the same number of slots");
        let (reserve, limit, sampling) = (caches[0].reserve, caches[0].limit, caches[0].sampling);
        let num_layers = caches[0].layers.len();
        let mut layers = Vec::with_capacity(num_layers);
        for l in 0..num_layers {
            let parts: Vec<LayerKv<B>> = caches.iter_mut().filter_map(|c| c.layers[l].take()).collect();
            if parts.is_empty() {
                layers.push(None);
                continue;
            }
            let cap = parts.iter().map(|p| p.k.dims()[2]).min().expect("non-empty");
            let (ks, vs): (Vec<_>, Vec<_>) = parts
                .into_iter()
                .map(|p| {
                    let [b, h, _, d] = p.k.dims();
                    (p.k.slice([0..b, 0..h, 0..cap, 0..d]), p.v.slice([0..b, 0..h, 0..cap, 0..d]))
                })
                .unzip();
            layers.push(Some(LayerKv { k: Tensor::cat(ks, 0), v: Tensor::cat(vs, 0) }));
        }
        KvCache { layers, len, reserve, limit, sampling, shared: None }
    }

    /// Keeps only the rows `rows` (in that order; a row may repeat), e.g. to fan one prefilled
    /// prompt out to G samples or to drop finished sequences: a layer at a time, each layer's
    /// old buffers dropped before the next is copied (a full cache dropping an eighth of its
    /// rows would otherwise hold 1.875 caches).
    pub fn select_rows(&mut self, rows: &[usize]) {
        self.shared = self.shared_in(rows);
        for layer in &mut self.layers {
            if let Some(kv) = layer.take() {
                *layer = Some(kv.rows(rows));
            }
        }
    }

    /// A new cache of the rows `rows` of this one (in that order; a row may repeat): one
    /// prefilled prefix fanned out to the prompts that continue it, in buffers of their own.
    pub fn copy_rows(&self, rows: &[usize]) -> Self {
        let layers = self.layers.iter().map(|kv| kv.as_ref().map(|kv| kv.rows(rows))).collect();
        let shared = self.shared_in(rows);
        KvCache { layers, len: self.len, reserve: self.reserve, limit: self.limit, sampling: self.sampling, shared }
    }

    /// Inserts `slots` empty slots before slot `at` in every row (zeros, which the rows' pads
    /// must cover: see [`super::layout`]), so that caches prefilled to different lengths can
    /// be stacked.
    pub fn widen(&mut self, at: usize, slots: usize) {
        if slots == 0 {
            return;
        }
        // Zeros in every row: the slots before `at` stay alike.
        if let Some(shared) = &mut self.shared {
            shared.slots = shared.slots.min(at);
        }
        for kv in self.layers.iter_mut().flatten() {
            let [b, h, cap, d] = kv.k.dims();
            let options = TensorCreationOptions::new(kv.k.device()).with_dtype(kv.k.dtype());
            let widen = |x: Tensor<B, 4>| {
                let (head, tail) = (x.clone().slice([0..b, 0..h, 0..at, 0..d]), x.slice([0..b, 0..h, at..cap, 0..d]));
                Tensor::cat(vec![head, Tensor::zeros([b, h, slots, d], options.clone()), tail], 2)
            };
            kv.k = widen(kv.k.clone());
            kv.v = widen(kv.v.clone());
        }
        self.len += slots;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Cpu;

    /// `[rows, 1, slots, 2]` keys whose every value is its row's number plus `slot0` + slot.
    fn keys(rows: usize, slot0: usize, slots: usize) -> Tensor<Cpu, 4> {
        let values: Vec<f32> =
            (0..rows).flat_map(|r| (0..slots).flat_map(move |s| [(r * 100 + slot0 + s) as f32; 2])).collect();
        Tensor::from_data(TensorData::new(values, [rows, 1, slots, 2]), &Default::default())
    }

    /// Sampling's cache keeps bf16 keys and values where the model computes in bf16, on the
    /// CPU too, written and grown in bf16; scoring's and training's keep f32 there.
    #[test]
    fn a_sampling_cache_keeps_the_attentions_dtype_on_the_cpu() {
        let (bf16, f32) = (ComputeDtype::Bf16, ComputeDtype::F32);
        assert_eq!(KvCache::<Cpu>::new(1, 4).dtype(bf16), Dtype::F32);
        assert_eq!(KvCache::<Cpu>::new(1, 4).for_sampling().dtype(f32), Dtype::F32);
        let mut cache = KvCache::<Cpu>::new(1, 2).with_limit(8).for_sampling();
        assert_eq!(cache.dtype(bf16), Dtype::Bf16);
        let half = |x: Tensor<Cpu, 4>| x.cast(bf16.burn());
        for start in 0..6 {
            cache.append(0, start, half(keys(2, start, 1)), half(keys(2, start, 1)));
            cache.advance(1);
        }
        let mut fanned = KvCache::concat(vec![cache.copy_rows(&[1]), cache.copy_rows(&[0])]);
        assert_eq!(fanned.dtype(bf16), Dtype::Bf16, "copies and stacks stay sampling caches");
        let (k, v) = fanned.append(0, 6, half(keys(2, 6, 1)), half(keys(2, 6, 1)));
        assert_eq!((k.dtype(), v.dtype()), (burn::tensor::DType::BF16, burn::tensor::DType::BF16));
        // The rows swapped, then slot 6 written as given; whole numbers below 256, exact in bf16.
        let row =
            |r: usize, last: usize| (0..7).flat_map(move |s| [(if s < 6 { r * 100 + s } else { last }) as f32; 2]);
        let want: Vec<f32> = row(1, 6).chain(row(0, 106)).collect();
        assert_eq!(k.cast(burn::tensor::DType::F32).into_data().to_vec::<f32>().unwrap(), want);
    }

    /// Rows fanned out from one row share the slots written so far; rows dropped leave their
    /// groups to the rest (a group's first row gone, the next leads it); a slot written again,
    /// or slots inserted, end what is shared there; a stack of caches shares nothing.
    #[test]
    fn fanned_out_rows_share_their_prompts_slots() {
        let mut cache = KvCache::<Cpu>::new(1, 8);
        cache.append(0, 0, keys(2, 0, 5), keys(2, 0, 5));
        cache.advance(5);
        assert_eq!(cache.shared_keys(), None);
        cache.select_rows(&[0, 0, 0, 1, 1]);
        assert_eq!(cache.shared_keys(), Some(&SharedKeys { slots: 5, source: vec![0, 0, 0, 3, 3] }));
        cache.append(0, 5, keys(5, 5, 1), keys(5, 5, 1));
        cache.advance(1);
        cache.select_rows(&[1, 2, 3]);
        assert_eq!(cache.shared_keys(), Some(&SharedKeys { slots: 5, source: vec![0, 0, 2] }));
        let mut copy = cache.copy_rows(&[2, 2]);
        assert_eq!(copy.shared_keys(), Some(&SharedKeys { slots: 6, source: vec![0, 0] }));
        copy.append(0, 2, keys(2, 2, 1), keys(2, 2, 1));
        assert_eq!(copy.shared_keys().map(|s| s.slots), Some(2), "slots written again");
        let mut widened = cache.copy_rows(&[2, 2]);
        widened.widen(4, 3);
        assert_eq!(widened.shared_keys().map(|s| s.slots), Some(4), "the slots before the inserted ones");
        assert_eq!(KvCache::concat(vec![copy, cache.copy_rows(&[0])]).shared_keys(), None);
        cache.select_rows(&[0, 2]);
        assert_eq!(cache.shared_keys(), None, "no two rows of a group left");
    }

    fn capacity(cache: &KvCache<Cpu>, layer: usize) -> usize {
        cache.layers[layer].as_ref().map_or(0, |kv| kv.k.dims()[2])
    }

    /// A prompt of 3 slots with room for 4, grown a slot at a time to its limit of 20: doubled
    /// to 8, then, past a quarter of the limit, 20 (not 16, then 32); every layer alike, and
    /// what was written kept. Dropping and repeating rows keeps each row's slots.
    #[test]
    fn the_cache_doubles_up_to_its_limit_and_keeps_its_rows() {
        let mut cache = KvCache::<Cpu>::new(2, 4).with_limit(20);
        let mut seen = Vec::new();
        for (start, slots) in std::iter::once((0, 3)).chain((3..20).map(|s| (s, 1))) {
            for layer in 0..2 {
                cache.append(layer, start, keys(2, start, slots), keys(2, start, slots));
            }
            cache.advance(slots);
            assert_eq!(capacity(&cache, 0), capacity(&cache, 1));
            seen.push(capacity(&cache, 0));
        }
        seen.dedup();
        assert_eq!(seen, [4, 8, 20]);
        let (k, _) = cache.append(1, 19, keys(2, 19, 1), keys(2, 19, 1));
        assert_eq!(k.into_data(), keys(2, 0, 20).into_data());
        cache.select_rows(&[1, 1, 0]);
        let (k, v) = cache.append(0, 10, keys(3, 10, 1), keys(3, 10, 1));
        let want: Vec<f32> =
            [1, 1, 0].iter().flat_map(|r| (0..10).flat_map(move |s| [(r * 100 + s) as f32; 2])).collect();
        assert_eq!(k.slice([0..3, 0..1, 0..10, 0..2]).into_data().to_vec::<f32>().unwrap(), want);
        assert_eq!(v.dims(), [3, 1, 11, 2]);
        // Past its limit (a caller's mistake) it still makes room.
        cache.append(0, 20, keys(3, 20, 1), keys(3, 20, 1));
        assert_eq!(capacity(&cache, 0), 21);
    }
}
