//! Chunk size limits, checked once up front so the chunking loop never has to.
//!
//! The limits are fastcdc's own: outside them its mask table has no entry and its
//! cut-point function would misbehave.

use fastcdc::v2020::{
    AVERAGE_MAX, AVERAGE_MIN, MAXIMUM_MAX, MAXIMUM_MIN, MINIMUM_MAX, MINIMUM_MIN,
};

/// Chunk size limits, validated by [`ChunkerParams::new`].
///
/// The fields are public for reading and pattern matching; build values with
/// [`ChunkerParams::new`] (or use [`ChunkerParams::DEFAULT`]), since
/// [`Chunker::new`](crate::Chunker::new) panics on limits that `new` would reject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChunkerParams {
    /// Smallest chunk, except that the last chunk of a stream may be shorter.
    pub min_size: u32,
    /// Target average chunk size.
    pub avg_size: u32,
    /// Largest chunk.
    pub max_size: u32,
}

/// Chunk size limits that [`ChunkerParams::new`] rejects.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParamsError {
    /// The minimum chunk size is outside fastcdc's range.
    #[error("Minimum chunk size {value} is outside the allowed range {lowest} to {highest}")]
    MinOutOfRange {
        value: u32,
        lowest: u32,
        highest: u32,
    },
    /// The average chunk size is outside fastcdc's range.
    #[error("Average chunk size {value} is outside the allowed range {lowest} to {highest}")]
    AvgOutOfRange {
        value: u32,
        lowest: u32,
        highest: u32,
    },
    /// The maximum chunk size is outside fastcdc's range.
    #[error("Maximum chunk size {value} is outside the allowed range {lowest} to {highest}")]
    MaxOutOfRange {
        value: u32,
        lowest: u32,
        highest: u32,
    },
    /// The sizes are not strictly increasing.
    #[error("Chunk sizes must satisfy min < avg < max, got min {min}, avg {avg}, max {max}")]
    NotIncreasing { min: u32, avg: u32, max: u32 },
    /// The window between minimum and maximum is too narrow for the average to be
    /// reached by content rather than forced by the maximum.
    #[error("Chunk sizes must satisfy max - min > avg, got min {min}, avg {avg}, max {max}")]
    RangeTooNarrow { min: u32, avg: u32, max: u32 },
}

impl ChunkerParams {
    /// Minimum 512 KiB, average 1 MiB, maximum 8 MiB.
    pub const DEFAULT: ChunkerParams = ChunkerParams {
        min_size: 512 * 1024,
        avg_size: 1024 * 1024,
        max_size: 8 * 1024 * 1024,
    };

    /// Checks that each size is within fastcdc's limits (minimum 64 B to 1 MiB, average
    /// 256 B to 4 MiB, maximum 1 KiB to 16 MiB), that `min < avg < max`, and that
    /// `max - min > avg`.
    pub fn new(min_size: u32, avg_size: u32, max_size: u32) -> Result<Self, ParamsError> {
        if !(MINIMUM_MIN..=MINIMUM_MAX).contains(&min_size) {
            return Err(ParamsError::MinOutOfRange {
                value: min_size,
                lowest: MINIMUM_MIN,
                highest: MINIMUM_MAX,
            });
        }
        if !(AVERAGE_MIN..=AVERAGE_MAX).contains(&avg_size) {
            return Err(ParamsError::AvgOutOfRange {
                value: avg_size,
                lowest: AVERAGE_MIN,
                highest: AVERAGE_MAX,
            });
        }
        if !(MAXIMUM_MIN..=MAXIMUM_MAX).contains(&max_size) {
            return Err(ParamsError::MaxOutOfRange {
                value: max_size,
                lowest: MAXIMUM_MIN,
                highest: MAXIMUM_MAX,
            });
        }
        if !(min_size < avg_size && avg_size < max_size) {
            return Err(ParamsError::NotIncreasing {
                min: min_size,
                avg: avg_size,
                max: max_size,
            });
        }
        if max_size - min_size <= avg_size {
            return Err(ParamsError::RangeTooNarrow {
                min: min_size,
                avg: avg_size,
                max: max_size,
            });
        }
        Ok(ChunkerParams {
            min_size,
            avg_size,
            max_size,
        })
    }
}

impl ChunkerParams {
    /// Limits for a target average in the default's proportions: minimum half of it,
    /// maximum eight times it, each kept within the allowed range (so an average of
    /// 4 MiB gets 1 MiB and 16 MiB), then checked as [`new`](Self::new) does.
    pub fn for_average(avg_size: u32) -> Result<Self, ParamsError> {
        let min_size = (avg_size / 2).clamp(MINIMUM_MIN, MINIMUM_MAX);
        let max_size = avg_size.saturating_mul(8).clamp(MAXIMUM_MIN, MAXIMUM_MAX);
        Self::new(min_size, avg_size, max_size)
    }
}

impl Default for ChunkerParams {
    fn default() -> Self {
        Self::DEFAULT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_params_are_valid() {
        let d = ChunkerParams::DEFAULT;
        assert_eq!(
            ChunkerParams::new(d.min_size, d.avg_size, d.max_size),
            Ok(d)
        );
        assert_eq!(ChunkerParams::default(), d);
    }

    #[test]
    fn min_not_below_avg_is_rejected_with_the_numbers() {
        let err = ChunkerParams::new(2048, 1024, 8192).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Chunk sizes must satisfy min < avg < max, got min 2048, avg 1024, max 8192"
        );
        assert!(matches!(
            ChunkerParams::new(1024, 1024, 8192),
            Err(ParamsError::NotIncreasing { .. })
        ));
    }

    #[test]
    fn avg_not_below_max_is_rejected() {
        assert_eq!(
            ChunkerParams::new(512, 8192, 8192),
            Err(ParamsError::NotIncreasing {
                min: 512,
                avg: 8192,
                max: 8192
            })
        );
    }

    #[test]
    fn range_not_wider_than_avg_is_rejected() {
        let err = ChunkerParams::new(4096, 8192, 12288).unwrap_err();
        assert_eq!(
            err,
            ParamsError::RangeTooNarrow {
                min: 4096,
                avg: 8192,
                max: 12288
            }
        );
        assert!(err
            .to_string()
            .starts_with("Chunk sizes must satisfy max - min > avg"));
        assert!(ChunkerParams::new(4096, 8192, 12289).is_ok());
    }

    #[test]
    fn sizes_outside_fastcdc_limits_are_rejected() {
        assert!(matches!(
            ChunkerParams::new(63, 1024, 8192),
            Err(ParamsError::MinOutOfRange { value: 63, .. })
        ));
        assert!(matches!(
            ChunkerParams::new(2 * 1024 * 1024, 3 * 1024 * 1024, 16 * 1024 * 1024),
            Err(ParamsError::MinOutOfRange { .. })
        ));
        assert!(matches!(
            ChunkerParams::new(64, 255, 8192),
            Err(ParamsError::AvgOutOfRange { value: 255, .. })
        ));
        assert!(matches!(
            ChunkerParams::new(64, 5 * 1024 * 1024, 16 * 1024 * 1024),
            Err(ParamsError::AvgOutOfRange { .. })
        ));
        assert!(matches!(
            ChunkerParams::new(1024, 4096, 16 * 1024 * 1024 + 1),
            Err(ParamsError::MaxOutOfRange { .. })
        ));
        let err = ChunkerParams::new(64, 256, 1023).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Maximum chunk size 1023 is outside the allowed range 1024 to 16777216"
        );
    }

    #[test]
    fn an_average_alone_gets_the_default_proportions_within_the_limits() {
        let d = ChunkerParams::DEFAULT;
        assert_eq!(ChunkerParams::for_average(d.avg_size), Ok(d));
        let p = ChunkerParams::for_average(16 * 1024).unwrap();
        assert_eq!((p.min_size, p.max_size), (8 * 1024, 128 * 1024));
        let p = ChunkerParams::for_average(4 * 1024 * 1024).unwrap();
        assert_eq!((p.min_size, p.max_size), (1024 * 1024, 16 * 1024 * 1024));
        assert!(matches!(
            ChunkerParams::for_average(100),
            Err(ParamsError::AvgOutOfRange { value: 100, .. })
        ));
        assert!(matches!(
            ChunkerParams::for_average(u32::MAX),
            Err(ParamsError::AvgOutOfRange { .. })
        ));
    }

    #[test]
    fn extreme_valid_limits_are_accepted() {
        assert!(ChunkerParams::new(64, 256, 1024).is_ok());
        assert!(ChunkerParams::new(1024 * 1024, 4 * 1024 * 1024, 16 * 1024 * 1024).is_ok());
    }
}
