//! How camera frames travel in samples: their pixel format and, for resized frame tables, their
//! size. Requests name them; the loader and the clients agree on them.

use std::fmt;

use serde::{Deserialize, Serialize};

/// How camera frames travel in samples.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FrameFormat {
    /// Packed RGB, height × width × 3 bytes: LeRobot's frames.
    #[default]
    Rgb24,
    /// Planar YUV 4:2:0 as decoded (Y, U, V planes, packed), for the video cameras whose frames
    /// are 8-bit 4:2:0 and whose RGB conversion `YuvToRgb` (lake-loader) reproduces; every other camera
    /// stays RGB. The camera column's metadata says which.
    Yuv420p,
    /// Each camera's compressed packets, the GOPs a batch shows, for the consumer to decode
    /// (lake-loader's `PacketBatchDecoder`): the camera column says which of the batch's decoded
    /// frames each sample and window slot shows, and `{camera}_packets` carries the GOPs. The
    /// frames decoded from them are the frames the other formats carry, byte for byte.
    Packets,
}

impl std::str::FromStr for FrameFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "rgb24" => Ok(Self::Rgb24),
            "yuv420p" => Ok(Self::Yuv420p),
            "packets" => Ok(Self::Packets),
            other => Err(format!("unknown frame format `{other}` (known: rgb24, yuv420p, packets)")),
        }
    }
}

impl fmt::Display for FrameFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Rgb24 => "rgb24",
            Self::Yuv420p => "yuv420p",
            Self::Packets => "packets",
        })
    }
}

/// The size frames of a resized frame table are stored at (every camera's), `WIDTHxHEIGHT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct FrameSize {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
}

impl std::str::FromStr for FrameSize {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let bad = || format!("frame size `{s}`: expected WIDTHxHEIGHT with each 1 to 8192, e.g. 224x224");
        let (w, h) = s.split_once(['x', 'X']).ok_or_else(bad)?;
        let (width, height) = (w.trim().parse::<u32>().map_err(|_| bad())?, h.trim().parse::<u32>().map_err(|_| bad())?);
        if !(1..=8192).contains(&width) || !(1..=8192).contains(&height) {
            return Err(bad());
        }
        Ok(Self { width, height })
    }
}

impl TryFrom<String> for FrameSize {
    type Error = String;

    fn try_from(s: String) -> std::result::Result<Self, String> {
        s.parse()
    }
}

impl From<FrameSize> for String {
    fn from(size: FrameSize) -> Self {
        size.to_string()
    }
}

impl fmt::Display for FrameSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}", self.width, self.height)
    }
}
