//! Functions lake adds to SQL.

use datafusion::{
    arrow::{
        compute::{cast, kernels::length::length},
        datatypes::DataType,
    },
    error::Result,
    logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, TypeSignature, Volatility},
};

/// `byte_length(x)`: the bytes a binary value (a packet's `data`, a picture) or a string holds,
/// as int64. DataFusion's `octet_length` takes strings only, and `length` of binary data reads
/// it as text.
#[derive(Debug, PartialEq, Eq, Hash)]
struct ByteLength {
    signature: Signature,
}

impl ScalarUDFImpl for ByteLength {
    fn name(&self) -> &str {
        "byte_length"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(DataType::Int64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let values = args.args[0].to_array(args.number_rows)?;
        Ok(ColumnarValue::Array(cast(&length(&values)?, &DataType::Int64)?))
    }
}

/// The functions lake adds, to register in a session.
pub fn functions() -> Vec<ScalarUDF> {
    let types = [DataType::Binary, DataType::LargeBinary, DataType::BinaryView, DataType::Utf8, DataType::LargeUtf8, DataType::Utf8View];
    let signature = Signature::one_of(types.into_iter().map(|t| TypeSignature::Exact(vec![t])).collect(), Volatility::Immutable);
    vec![ScalarUDF::new_from_impl(ByteLength { signature })]
}

#[cfg(test)]
mod tests {
    use datafusion::{
        arrow::array::{Array, AsArray},
        prelude::SessionContext,
    };

    #[tokio::test]
    async fn byte_length_counts_the_bytes_of_binary_and_text() {
        let ctx = SessionContext::new();
        for f in super::functions() {
            ctx.register_udf(f);
        }
        let sql = "SELECT byte_length(X'00ff10'), byte_length(arrow_cast(X'0102', 'LargeBinary')), byte_length('héllo'), \
                   byte_length(CAST(NULL AS BYTEA))";
        let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
        let row: Vec<Option<i64>> = batches[0]
            .columns()
            .iter()
            .map(|c| {
                let c = c.as_primitive::<datafusion::arrow::datatypes::Int64Type>();
                c.is_valid(0).then(|| c.value(0))
            })
            .collect();
        assert_eq!(row, [Some(3), Some(2), Some(6), None]);
    }
}
