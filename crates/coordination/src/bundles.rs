//! Namespace bundles: Pulsar's `NamespaceBundles`, `NamespaceBundleFactory.getBundles` and its
//! split algorithms (`range_equally_divide`, `topic_count_equally_divide`).

use crate::crc32::crc32;

/// The hash space's bounds; the last bundle includes the upper one.
pub const FULL_LOWER: u32 = 0x0000_0000;
pub const FULL_UPPER: u32 = 0xffff_ffff;
/// Pulsar's `defaultNumberOfNamespaceBundles`.
pub const DEFAULT_BUNDLES: u32 = 4;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BundleError {
    /// Pulsar: "Invalid number of bundles. Number of bundles has to be in the range of (0, 2^32]."
    #[error("Invalid number of bundles. Number of bundles has to be in the range of (0, 2^32].")]
    Count,
    #[error("invalid bundle boundary {0:?}: expected 0x followed by 8 hex digits")]
    Boundary(String),
    #[error("invalid bundle range {0:?}: expected 0x........_0x........ with lower < upper")]
    Range(String),
    /// Pulsar: "Input bundles do not cover the whole hash range".
    #[error("Input bundles do not cover the whole hash range. first:{first}, last:{last}")]
    Coverage { first: String, last: String },
    #[error("bundle boundaries must increase: {0}")]
    Order(String),
    #[error("bundle {0} is not a bundle of this namespace")]
    NoSuchBundle(String),
    /// The split point is not strictly inside the bundle (a bundle of one hash, or of one topic).
    #[error("bundle {0} cannot be split there")]
    Unsplittable(String),
}

/// A bundle's hash range, `[lower, upper)`, or `[lower, upper]` for the namespace's last one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BundleRange {
    pub lower: u32,
    pub upper: u32,
}

fn boundary(value: u32) -> String {
    format!("0x{value:08x}")
}

fn parse_boundary(text: &str) -> Result<u32, BundleError> {
    let digits = text.strip_prefix("0x").filter(|d| d.len() == 8);
    digits
        .and_then(|d| u32::from_str_radix(d, 16).ok())
        .ok_or_else(|| BundleError::Boundary(text.to_string()))
}

impl BundleRange {
    /// Whether `hash` falls in the bundle.
    pub fn contains(&self, hash: u32) -> bool {
        hash >= self.lower
            && (hash < self.upper || (self.upper == FULL_UPPER && hash == FULL_UPPER))
    }

    /// Pulsar's name for it: `0x00000000_0x40000000`.
    pub fn name(&self) -> String {
        format!("{}_{}", boundary(self.lower), boundary(self.upper))
    }

    pub fn parse(name: &str) -> Result<BundleRange, BundleError> {
        let bad = || BundleError::Range(name.to_string());
        let (lower, upper) = name.split_once('_').ok_or_else(bad)?;
        let range = BundleRange {
            lower: parse_boundary(lower).map_err(|_| bad())?,
            upper: parse_boundary(upper).map_err(|_| bad())?,
        };
        if range.lower >= range.upper {
            return Err(bad());
        }
        Ok(range)
    }
}

impl std::fmt::Display for BundleRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

/// The bundle hash of a topic: CRC32 of its full name (`persistent://t/ns/x-partition-0`).
pub fn topic_hash(topic: &str) -> u32 {
    crc32(topic.as_bytes())
}

/// A namespace's bundles: boundaries from `0x00000000` to `0xffffffff`, strictly increasing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bundles {
    boundaries: Vec<u32>,
}

/// How a bundle is split (`namespaces split-bundle --split-algorithm-name`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitAlgorithm {
    /// `range_equally_divide` (Pulsar's default): at the middle of the range.
    RangeEquallyDivide,
    /// `topic_count_equally_divide`: between the two middle topics' hashes.
    TopicCountEquallyDivide,
}

impl SplitAlgorithm {
    pub fn from_name(name: &str) -> Option<SplitAlgorithm> {
        match name {
            "range_equally_divide" => Some(SplitAlgorithm::RangeEquallyDivide),
            "topic_count_equally_divide" => Some(SplitAlgorithm::TopicCountEquallyDivide),
            _ => None,
        }
    }
}

impl Bundles {
    /// `n` even bundles, as Pulsar's `getBundles(n)`: boundaries `i * (2^32 / n)`, the last
    /// `0xffffffff`.
    pub fn even(n: u64) -> Result<Bundles, BundleError> {
        if n == 0 || n > 1 << 32 {
            return Err(BundleError::Count);
        }
        let size = (1u64 << 32) / n;
        let mut boundaries: Vec<u32> = (0..n).map(|i| (i * size) as u32).collect();
        boundaries.push(FULL_UPPER);
        boundaries.dedup();
        Ok(Bundles { boundaries })
    }

    /// From stored boundaries (`bundles.boundaries` of a namespace's policies).
    pub fn from_boundaries<S: AsRef<str>>(boundaries: &[S]) -> Result<Bundles, BundleError> {
        let values =
            boundaries.iter().map(|b| parse_boundary(b.as_ref())).collect::<Result<Vec<_>, _>>()?;
        let (first, last) = (values.first().copied(), values.last().copied());
        if values.len() < 2 || first != Some(FULL_LOWER) || last != Some(FULL_UPPER) {
            let text = |v: Option<u32>| v.map(boundary).unwrap_or_default();
            return Err(BundleError::Coverage { first: text(first), last: text(last) });
        }
        if let Some(pair) = values.windows(2).find(|pair| pair[0] >= pair[1]) {
            return Err(BundleError::Order(format!(
                "{} then {}",
                boundary(pair[0]),
                boundary(pair[1])
            )));
        }
        Ok(Bundles { boundaries: values })
    }

    /// The boundaries as Pulsar stores and shows them.
    pub fn boundary_strings(&self) -> Vec<String> {
        self.boundaries.iter().copied().map(boundary).collect()
    }

    pub fn len(&self) -> usize {
        self.boundaries.len() - 1
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn ranges(&self) -> impl Iterator<Item = BundleRange> + '_ {
        self.boundaries.windows(2).map(|pair| BundleRange { lower: pair[0], upper: pair[1] })
    }

    /// The bundle `hash` is in.
    pub fn find(&self, hash: u32) -> BundleRange {
        // The last boundary not above the hash starts its bundle (the upper bound is in the last).
        let index = self.boundaries.partition_point(|&b| b <= hash).saturating_sub(1);
        let index = index.min(self.len() - 1);
        let range =
            BundleRange { lower: self.boundaries[index], upper: self.boundaries[index + 1] };
        assert!(range.contains(hash), "bundles cover the hash space");
        range
    }

    /// The bundle a topic is in.
    pub fn find_topic(&self, topic: &str) -> BundleRange {
        self.find(topic_hash(topic))
    }

    /// Whether `range` is one of the bundles.
    pub fn has(&self, range: BundleRange) -> bool {
        self.boundaries
            .binary_search(&range.lower)
            .is_ok_and(|i| self.boundaries.get(i + 1) == Some(&range.upper))
    }

    /// Splits `range` at `at` into `[lower, at)` and `[at, upper)`.
    pub fn split_at(&self, range: BundleRange, at: u32) -> Result<Bundles, BundleError> {
        if !self.has(range) {
            return Err(BundleError::NoSuchBundle(range.name()));
        }
        if at <= range.lower || at >= range.upper {
            return Err(BundleError::Unsplittable(range.name()));
        }
        let mut boundaries = self.boundaries.clone();
        let index = boundaries.partition_point(|&b| b < at);
        boundaries.insert(index, at);
        Ok(Bundles { boundaries })
    }

    /// Where `algorithm` splits `range`, given the hashes of the topics in it (used by
    /// `TopicCountEquallyDivide` only); `None`: it cannot be split.
    pub fn split_point(
        range: BundleRange,
        algorithm: SplitAlgorithm,
        topic_hashes: &[u32],
    ) -> Option<u32> {
        let at = match algorithm {
            SplitAlgorithm::RangeEquallyDivide => range.lower + (range.upper - range.lower) / 2,
            SplitAlgorithm::TopicCountEquallyDivide => {
                let mut hashes: Vec<u32> =
                    topic_hashes.iter().copied().filter(|&h| range.contains(h)).collect();
                if hashes.len() < 2 {
                    return None;
                }
                hashes.sort_unstable();
                let start = hashes[(hashes.len() / 2).saturating_sub(1)];
                let end = hashes[hashes.len() / 2];
                start + (end - start) / 2
            }
        };
        (at > range.lower && at < range.upper).then_some(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn four_even_bundles_are_pulsars() {
        let bundles = Bundles::even(u64::from(DEFAULT_BUNDLES)).unwrap();
        assert_eq!(
            bundles.boundary_strings(),
            ["0x00000000", "0x40000000", "0x80000000", "0xc0000000", "0xffffffff"]
        );
        let names: Vec<String> = bundles.ranges().map(|r| r.name()).collect();
        assert_eq!(names[0], "0x00000000_0x40000000");
        assert_eq!(names[3], "0xc0000000_0xffffffff");
        assert_eq!(Bundles::even(1).unwrap().boundary_strings(), ["0x00000000", "0xffffffff"]);
        // Pulsar's getBundles(3): 2^32 / 3 = 0x55555555.
        assert_eq!(
            Bundles::even(3).unwrap().boundary_strings(),
            ["0x00000000", "0x55555555", "0xaaaaaaaa", "0xffffffff"]
        );
        assert_eq!(Bundles::even(0), Err(BundleError::Count));
    }

    #[test]
    fn every_hash_is_in_exactly_one_bundle_and_the_upper_bound_in_the_last() {
        let bundles = Bundles::even(4).unwrap();
        for hash in
            [0, 1, 0x3fff_ffff, 0x4000_0000, 0x8000_0001, 0xbfff_ffff, 0xc000_0000, FULL_UPPER]
        {
            let found = bundles.find(hash);
            assert_eq!(bundles.ranges().filter(|r| r.contains(hash)).count(), 1, "{hash:#x}");
            assert!(found.contains(hash));
        }
        assert_eq!(bundles.find(0x4000_0000).name(), "0x40000000_0x80000000");
        assert_eq!(bundles.find(FULL_UPPER).name(), "0xc0000000_0xffffffff");
    }

    #[test]
    fn a_topic_is_hashed_by_its_full_name_with_crc32() {
        // CRC32 (IEEE) of the full name, as Guava's Hashing.crc32() gives it.
        let topic = "persistent://public/default/my-topic";
        assert_eq!(topic_hash(topic), crate::crc32::crc32(topic.as_bytes()));
        let bundles = Bundles::even(4).unwrap();
        assert!(bundles.find_topic(topic).contains(topic_hash(topic)));
        // Partitions are hashed apart.
        assert_ne!(
            topic_hash("persistent://t/n/x-partition-0"),
            topic_hash("persistent://t/n/x-partition-1")
        );
    }

    #[test]
    fn stored_boundaries_must_cover_the_hash_space_in_order() {
        let ok = Bundles::from_boundaries(&["0x00000000", "0x80000000", "0xffffffff"]).unwrap();
        assert_eq!(ok.len(), 2);
        assert!(matches!(
            Bundles::from_boundaries(&["0x00000001", "0xffffffff"]),
            Err(BundleError::Coverage { .. })
        ));
        assert!(matches!(
            Bundles::from_boundaries(&["0x00000000", "0x90000000", "0x80000000", "0xffffffff"]),
            Err(BundleError::Order(_))
        ));
        assert!(matches!(
            Bundles::from_boundaries(&["0", "0xffffffff"]),
            Err(BundleError::Boundary(_))
        ));
        assert_eq!(BundleRange::parse("0x40000000_0x80000000").unwrap().lower, 0x4000_0000);
        assert!(BundleRange::parse("0x80000000_0x40000000").is_err());
    }

    #[test]
    fn splits_by_range_and_by_topic_count() {
        let bundles = Bundles::even(4).unwrap();
        let first = BundleRange::parse("0x00000000_0x40000000").unwrap();
        let at = Bundles::split_point(first, SplitAlgorithm::RangeEquallyDivide, &[]).unwrap();
        assert_eq!(at, 0x2000_0000);
        let split = bundles.split_at(first, at).unwrap();
        assert_eq!(split.len(), 5);
        assert!(split.has(BundleRange::parse("0x00000000_0x20000000").unwrap()));
        assert!(split.has(BundleRange::parse("0x20000000_0x40000000").unwrap()));
        assert!(!split.has(first));
        // By topic count: between the two middle hashes of the topics in the bundle.
        let hashes = [0x10, 0x30, 0x50, 0x70, 0x9000_0000];
        let at = Bundles::split_point(first, SplitAlgorithm::TopicCountEquallyDivide, &hashes);
        assert_eq!(at, Some(0x40));
        assert_eq!(
            Bundles::split_point(first, SplitAlgorithm::TopicCountEquallyDivide, &[0x10]),
            None
        );
        assert!(matches!(bundles.split_at(first, 0), Err(BundleError::Unsplittable(_))));
        assert!(matches!(
            bundles.split_at(BundleRange { lower: 1, upper: 2 }, 1),
            Err(BundleError::NoSuchBundle(_))
        ));
        assert_eq!(
            SplitAlgorithm::from_name("topic_count_equally_divide"),
            Some(SplitAlgorithm::TopicCountEquallyDivide)
        );
    }
}
