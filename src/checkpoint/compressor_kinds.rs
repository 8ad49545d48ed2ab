//! The compressor and indexer linears whose storage a checkpoint may choose (BF16 in the
//! Flash release, FP8 blocks with E8M0 scales in some others): [`CompressorLinear`] names the
//! five kinds, [`CompressorKinds`] is the set a checkpoint stores as FP8 (settled per kind for
//! the whole model by `Checkpoint::inventory_options`; docs/spec/model.md section 9).

/// The five compressor / indexer linears of an attention block, by module name after
/// `attn.` (their storage is settled per kind, see [`CompressorKinds`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CompressorLinear {
    /// `compressor.wkv`
    Wkv,
    /// `compressor.wgate`
    Wgate,
    /// `indexer.weights_proj`
    IndexerWeightsProj,
    /// `indexer.compressor.wkv`
    IndexerWkv,
    /// `indexer.compressor.wgate`
    IndexerWgate,
}

impl CompressorLinear {
    pub const ALL: [CompressorLinear; 5] = [
        CompressorLinear::Wkv,
        CompressorLinear::Wgate,
        CompressorLinear::IndexerWeightsProj,
        CompressorLinear::IndexerWkv,
        CompressorLinear::IndexerWgate,
    ];

    /// The module name after the layer prefix (`attn.compressor.wkv`).
    pub fn module(self) -> &'static str {
        match self {
            CompressorLinear::Wkv => "attn.compressor.wkv",
            CompressorLinear::Wgate => "attn.compressor.wgate",
            CompressorLinear::IndexerWeightsProj => "attn.indexer.weights_proj",
            CompressorLinear::IndexerWkv => "attn.indexer.compressor.wkv",
            CompressorLinear::IndexerWgate => "attn.indexer.compressor.wgate",
        }
    }

    /// The kind of the stored weight `name` (`layers.3.attn.compressor.wkv.weight`), if it is
    /// one of these.
    pub fn of_weight(name: &str) -> Option<CompressorLinear> {
        let module = name.strip_suffix(".weight")?;
        CompressorLinear::ALL.into_iter().find(|k| {
            module
                .strip_suffix(k.module())
                .is_some_and(|prefix| prefix.ends_with('.'))
        })
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// A set of [`CompressorLinear`] kinds (those a checkpoint stores as FP8 blocks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CompressorKinds(u8);

impl CompressorKinds {
    pub const NONE: CompressorKinds = CompressorKinds(0);
    pub const ALL: CompressorKinds = CompressorKinds(0b1_1111);

    pub fn contains(self, kind: CompressorLinear) -> bool {
        self.0 & kind.bit() != 0
    }

    pub fn insert(&mut self, kind: CompressorLinear) {
        self.0 |= kind.bit();
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The module names of the kinds in the set, in [`CompressorLinear::ALL`] order.
    pub fn modules(self) -> Vec<&'static str> {
        CompressorLinear::ALL
            .into_iter()
            .filter(|k| self.contains(*k))
            .map(CompressorLinear::module)
            .collect()
    }
}
