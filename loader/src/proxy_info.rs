//! What a training proxy is (`lake cache NAME --proxy CODEC`, written by `write_proxy`): how it
//! was encoded, its streams, how far each camera is from the recorded frames, and the label a
//! camera column served from it carries.

use lake_codec::{ProxySettings, StreamConfig};
use lake_schemas::tables::{PACKET_CHECKSUM, PROXY, PROXY_METADATA};
use lake_store::Lake;

use crate::{
    Error, Result,
    frames::{Mismatch, check},
};

/// What a proxy is: how it was encoded, its streams, and how far each camera is from the
/// recorded frames.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProxyInfo {
    /// Codec, GOP and CRF.
    #[serde(flatten)]
    pub settings: ProxySettings,
    /// Per camera, in the order of the dataset's cameras.
    pub cameras: Vec<ProxyCamera>,
    /// The decoder parameters of every re-encoded stream (stream ids are the recorded ones).
    pub streams: Vec<StreamConfig>,
}

/// One camera of a proxy.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProxyCamera {
    /// The camera key.
    pub camera: String,
    /// Frames re-encoded (pictures of an image camera are kept as they are).
    pub frames: u64,
    /// PSNR in dB of every frame against its recorded frame, over all their RGB samples
    /// (`None`: equal, as for pictures).
    pub psnr_db: Option<f64>,
    /// The PSNR of the frame furthest from its recorded frame.
    pub min_psnr_db: Option<f64>,
    /// Bytes of the proxy's packets.
    pub bytes: u64,
    /// Bytes of the recorded packets of the same frames.
    pub recorded_bytes: u64,
}

impl ProxyInfo {
    /// `h264 proxy (GOP 8, CRF 18)`.
    pub fn label(&self) -> String {
        let ProxySettings { codec, gop, crf } = self.settings;
        format!("{codec} proxy (GOP {gop}, CRF {crf})")
    }

    /// The camera `key`, if the proxy has it.
    pub fn camera(&self, key: &str) -> Option<&ProxyCamera> {
        self.cameras.iter().find(|c| c.camera == key)
    }

    /// A camera's PSNR in words: `41.2 dB (worst frame 37.9 dB)`, or `exact`.
    pub fn psnr_words(camera: &ProxyCamera) -> String {
        match (camera.psnr_db, camera.min_psnr_db) {
            (Some(mean), Some(worst)) => format!("{mean:.1} dB (worst frame {worst:.1} dB)"),
            _ => "exact".into(),
        }
    }

    /// The proxy of a version, read from its table's schema metadata; `None` when it has none.
    ///
    /// # Errors
    /// When the table exists but cannot be opened, or its metadata is not a proxy's.
    pub async fn read(lake: &Lake, record: &lake_schemas::CommitRecord) -> Result<Option<Self>> {
        if !lake.has_table(&record.tables.dir, PROXY).await? {
            return Ok(None);
        }
        let table = lake_store::open_table(lake, record, PROXY).await?;
        Self::of_table(&table, &format!("{}@{}", record.name, record.version)).map(Some)
    }

    pub(crate) fn of_table(table: &lake_store::deps::lance::Dataset, label: &str) -> Result<Self> {
        let json = table
            .schema()
            .metadata
            .get(PROXY_METADATA)
            .ok_or_else(|| Error::layout(label, format!("the proxy table has no `{PROXY_METADATA}` metadata")))?;
        serde_json::from_str(json).map_err(|e| Error::layout(label, format!("the proxy table's `{PROXY_METADATA}` metadata: {e}")))
    }
}

/// What [`verify_proxy`] found in a version's training proxy.
#[derive(Debug, Clone, PartialEq)]
pub struct ProxyCheck {
    /// How the proxy was encoded (what `lake cache --proxy` makes again).
    pub settings: ProxySettings,
    /// Packets read.
    pub packets: u64,
    /// Bytes of packets read.
    pub bytes: u64,
    /// The packets whose bytes are not those `lake cache --proxy` stored, each by the `packets`
    /// row of the recorded frame it re-encodes, with what was read.
    pub damaged: Vec<(u64, Mismatch)>,
}

/// Reads every packet of `record`'s training proxy and checks each against the CRC-32 stored
/// with it; `None` when the version has no proxy.
///
/// # Errors
/// When the proxy cannot be opened or read (its files are missing or cut short), or its
/// metadata is not a proxy's.
pub async fn verify_proxy(lake: &Lake, record: &lake_schemas::CommitRecord) -> Result<Option<ProxyCheck>> {
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::{UInt32Type, UInt64Type};
    use futures::TryStreamExt;
    if !lake.has_table(&record.tables.dir, PROXY).await? {
        return Ok(None);
    }
    let label = format!("{}@{}", record.name, record.version);
    let table = lake_store::open_table(lake, record, PROXY).await?;
    let info = ProxyInfo::of_table(&table, &label)?;
    let lance = |error| Error::Lance { dataset: label.clone(), table: PROXY.into(), error: Box::new(error) };
    let mut scan = table.scan();
    scan.project(&["data", PACKET_CHECKSUM, "source_row"]).map_err(lance)?;
    let uri = table.uri().to_string();
    let mut batches = lake_store::stream_lance(&uri, lake_store::read_lance(&uri, scan.try_into_stream()).await.map_err(lance)?);
    let mut found = ProxyCheck { settings: info.settings, packets: 0, bytes: 0, damaged: Vec::new() };
    while let Some(batch) = batches.try_next().await.map_err(lance)? {
        let columns = (
            batch.column(0).as_binary_opt::<i64>(),
            batch.column(1).as_primitive_opt::<UInt32Type>(),
            batch.column(2).as_primitive_opt::<UInt64Type>(),
        );
        let (Some(data), Some(sums), Some(rows)) = columns else {
            return Err(Error::layout(&label, "the proxy table's columns are not a proxy's"));
        };
        for i in 0..data.len() {
            if let Err(mismatch) = check(data.value(i), Some(sums.value(i))) {
                found.damaged.push((rows.value(i), mismatch));
            }
            found.packets += 1;
            found.bytes += data.value(i).len() as u64;
        }
    }
    Ok(Some(found))
}

/// What a camera column served from proxies says of them ([`PROXY_METADATA`] in its field
/// metadata, as JSON): per dataset version, how its proxy was encoded and its PSNR against the
/// recorded frames.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProxyLabel {
    /// What the frames are.
    pub note: String,
    /// Per `name@version`.
    pub datasets: std::collections::BTreeMap<String, ProxyLabelEntry>,
}

/// One dataset's entry of a [`ProxyLabel`].
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProxyLabelEntry {
    /// Codec, GOP and CRF.
    #[serde(flatten)]
    pub settings: ProxySettings,
    /// The camera's PSNR in dB against the recorded frames (`None`: equal).
    pub psnr_db: Option<f64>,
    /// The PSNR of its frame furthest from the recorded one.
    pub min_psnr_db: Option<f64>,
}

impl ProxyLabel {
    /// The label of `camera` of dataset `label` served from `info`.
    pub fn of(info: &ProxyInfo, label: &str, camera: &str) -> Self {
        let (psnr_db, min_psnr_db) = info.camera(camera).map_or((None, None), |c| (c.psnr_db, c.min_psnr_db));
        Self {
            note: "frames of a training proxy: re-encoded (lossy), not the recorded frames".into(),
            datasets: [(label.to_string(), ProxyLabelEntry { settings: info.settings, psnr_db, min_psnr_db })].into(),
        }
    }

    /// The label as field metadata holds it.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("plain data")
    }
}

/// `schema` with the proxy label of every camera column naming every dataset of a mixture
/// (each dataset's schema labels its own).
pub(crate) fn merge_labels(schema: &arrow::datatypes::Schema, labels: &[arrow::datatypes::Schema]) -> arrow::datatypes::Schema {
    let fields: Vec<arrow::datatypes::Field> = schema
        .fields()
        .iter()
        .map(|f| {
            let Some(first) = f.metadata().get(PROXY_METADATA).and_then(|j| serde_json::from_str::<ProxyLabel>(j).ok()) else {
                return f.as_ref().clone();
            };
            let mut merged = first;
            for other in labels.iter().filter_map(|s| s.field_with_name(f.name()).ok()) {
                if let Some(label) = other.metadata().get(PROXY_METADATA).and_then(|j| serde_json::from_str::<ProxyLabel>(j).ok()) {
                    merged.datasets.extend(label.datasets);
                }
            }
            let mut metadata = f.metadata().clone();
            metadata.insert(PROXY_METADATA.into(), merged.to_json());
            f.as_ref().clone().with_metadata(metadata)
        })
        .collect();
    arrow::datatypes::Schema::new_with_metadata(fields, schema.metadata().clone())
}

#[cfg(test)]
mod tests {
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;
    use lake_codec::ProxyCodec;

    fn info(codec: ProxyCodec, psnr_db: f64) -> ProxyInfo {
        let camera = ProxyCamera {
            camera: "cam".into(),
            frames: 4,
            psnr_db: Some(psnr_db),
            min_psnr_db: Some(psnr_db - 2.0),
            bytes: 1,
            recorded_bytes: 1,
        };
        ProxyInfo { settings: ProxySettings { codec, gop: 8, crf: 18 }, cameras: vec![camera], streams: vec![] }
    }

    fn schema(label: &ProxyLabel) -> Schema {
        let camera = Field::new("cam", DataType::UInt8, false).with_metadata([(PROXY_METADATA.to_string(), label.to_json())].into());
        Schema::new(vec![camera, Field::new("action", DataType::Float32, false)])
    }

    #[test]
    fn a_mixture_labels_each_camera_with_every_dataset_proxy() {
        let (a, b) =
            (ProxyLabel::of(&info(ProxyCodec::H264, 41.0), "a@1", "cam"), ProxyLabel::of(&info(ProxyCodec::Hevc, 38.5), "b@2", "cam"));
        assert_eq!(a.datasets["a@1"].psnr_db, Some(41.0));
        assert_eq!(ProxyLabel::of(&info(ProxyCodec::H264, 41.0), "a@1", "other").datasets["a@1"].psnr_db, None, "a camera the proxy lacks");
        let merged = merge_labels(&schema(&a), &[schema(&a), schema(&b)]);
        let label: ProxyLabel = serde_json::from_str(&merged.field(0).metadata()[PROXY_METADATA]).expect("a label");
        assert_eq!(label.datasets.keys().collect::<Vec<_>>(), ["a@1", "b@2"]);
        assert_eq!((label.datasets["b@2"].settings.codec, label.datasets["b@2"].min_psnr_db), (ProxyCodec::Hevc, Some(36.5)));
        assert!(merged.field(1).metadata().is_empty(), "other columns as they were");
    }
}
