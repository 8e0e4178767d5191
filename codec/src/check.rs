//! The frame check of ingest's `--verify`: every packet of a file decoded once, the frames that do
//! not come out whole named by their packet.

use std::collections::{HashMap, HashSet};

use ffmpeg_next as ffmpeg;
use lake_schemas::CodecParams;

use crate::{DemuxedPacket, Error, Result, codec_context, frame_damage, strict};

/// Every packet of a file decoded once, in decode order, by a decoder set up as the loader's
/// are: the packets whose frames do not come out whole (the decoder stops at them, conceals
/// damage in them, or never gives their frame), each with why.
pub struct FrameCheck {
    decoder: ffmpeg::decoder::Video,
    frame: ffmpeg::frame::Video,
    /// The decode position of each packet by its pts, and whether its frame came out.
    packets: HashMap<i64, (u64, bool)>,
    failed: Vec<(u64, String)>,
}

impl FrameCheck {
    /// A decoder for the stream ingest recorded as `params`, set up as the loader's are.
    ///
    /// # Errors
    /// When FFmpeg has no decoder for the codec or cannot open it.
    pub fn open(params: &CodecParams) -> Result<Self> {
        let mut ctx = codec_context(params)?;
        strict(&mut ctx);
        let decoder = ctx.decoder().video().map_err(|e| Error::Open(format!("opening a decoder for the file's stream: {e}")))?;
        Ok(Self { decoder, frame: ffmpeg::frame::Video::empty(), packets: HashMap::new(), failed: Vec::new() })
    }

    /// Decodes the packet at decode position `pos`.
    pub fn feed(&mut self, pos: u64, packet: &DemuxedPacket) {
        let p = crate::context::packet(&packet.data, packet.pts, packet.dts, packet.container_keyframe);
        self.packets.insert(packet.pts, (pos, false));
        if let Err(e) = self.decoder.send_packet(&p) {
            self.failed.push((pos, format!("the decoder stops at it: {e}")));
        }
        self.drain(pos);
    }

    /// Takes the frames the decoder has ready; an error is the packet at `pos`'s.
    fn drain(&mut self, pos: u64) {
        loop {
            match self.decoder.receive_frame(&mut self.frame) {
                Ok(()) => {
                    let pts = self.frame.pts().or_else(|| self.frame.timestamp());
                    let Some(&(at, _)) = pts.and_then(|pts| self.packets.get(&pts)) else { continue };
                    if let Some(pts) = pts {
                        self.packets.insert(pts, (at, true));
                    }
                    if let Some(why) = frame_damage(&self.frame) {
                        self.failed.push((at, why));
                    }
                }
                Err(ffmpeg::Error::Other { errno }) if errno == ffmpeg::util::error::EAGAIN => return,
                Err(ffmpeg::Error::Eof) => return,
                Err(e) => {
                    self.failed.push((pos, format!("the decoder stops at it: {e}")));
                    return;
                }
            }
        }
    }

    /// The packets whose frames did not come out whole, in decode order.
    /// `last`: the decode position of the file's last packet.
    pub fn finish(mut self, last: u64) -> Vec<(u64, String)> {
        if self.decoder.send_eof().is_ok() {
            self.drain(last);
        }
        let failed: HashSet<u64> = self.failed.iter().map(|(pos, _)| *pos).collect();
        for &(pos, out) in self.packets.values() {
            if !out && !failed.contains(&pos) {
                self.failed.push((pos, "the decoder gives no frame for it".into()));
            }
        }
        self.failed.sort_by_key(|(pos, _)| *pos);
        self.failed
    }
}
