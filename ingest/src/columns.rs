//! Reading typed values out of Arrow columns whose exact type varies between writers
//! (int32 vs int64, list vs large list vs fixed-size list, string vs large string).

use arrow::{
    array::{Array, ArrayRef, AsArray, RecordBatch},
    compute::cast,
    datatypes::{DataType, Float64Type, Int64Type},
};

/// Values of column `name` as `i64` (nulls as `None`), or `None` when the column is absent.
pub fn i64s(batch: &RecordBatch, name: &str) -> Option<Result<Vec<Option<i64>>, String>> {
    let col = batch.column_by_name(name)?;
    Some(cast(col, &DataType::Int64).map_err(|e| format!("column `{name}`: {e}")).map(|a| a.as_primitive::<Int64Type>().iter().collect()))
}

/// Values of column `name` as `f64` (nulls as `None`), or `None` when the column is absent.
pub fn f64s(batch: &RecordBatch, name: &str) -> Option<Result<Vec<Option<f64>>, String>> {
    let col = batch.column_by_name(name)?;
    Some(
        cast(col, &DataType::Float64)
            .map_err(|e| format!("column `{name}`: {e}"))
            .map(|a| a.as_primitive::<Float64Type>().iter().collect()),
    )
}

/// Values of a string column (nulls as `None`).
pub fn strings(col: &ArrayRef) -> Result<Vec<Option<String>>, String> {
    // Bytes that are not UTF-8 are named (a cast would make them nulls).
    if matches!(col.data_type(), DataType::Binary | DataType::LargeBinary | DataType::BinaryView) {
        let bytes = cast(col, &DataType::LargeBinary).map_err(|e| e.to_string())?;
        let bytes = bytes.as_binary::<i64>();
        if let Some(row) = (0..bytes.len()).find(|&r| bytes.is_valid(r) && std::str::from_utf8(bytes.value(r)).is_err()) {
            return Err(format!("row {row} is not UTF-8 text"));
        }
    }
    let a = cast(col, &DataType::Utf8).map_err(|e| e.to_string())?;
    Ok(a.as_string::<i32>().iter().map(|s| s.map(str::to_string)).collect())
}

/// Values of a list-of-strings column, one list per row (a null row is an empty list).
pub fn string_lists(col: &ArrayRef) -> Result<Vec<Vec<String>>, String> {
    let (values, offsets): (ArrayRef, Vec<(usize, usize)>) = match col.data_type() {
        DataType::List(_) => {
            let l = col.as_list::<i32>();
            (l.values().clone(), (0..l.len()).map(|i| (l.value_offsets()[i] as usize, l.value_offsets()[i + 1] as usize)).collect())
        }
        DataType::LargeList(_) => {
            let l = col.as_list::<i64>();
            (l.values().clone(), (0..l.len()).map(|i| (l.value_offsets()[i] as usize, l.value_offsets()[i + 1] as usize)).collect())
        }
        other => return Err(format!("expected a list of strings, found {other}")),
    };
    let values = strings(&values)?;
    Ok(offsets.into_iter().map(|(a, b)| values[a..b].iter().flatten().cloned().collect()).collect())
}

/// Flattens the value at `row` of a (possibly nested) list column of numbers into `f64`s and
/// its shape, e.g. a `(3, 1, 1)` image statistic. A scalar gives shape `[]`.
pub fn flatten_numbers(col: &dyn Array, row: usize) -> Result<(Vec<f64>, Vec<i64>), String> {
    if col.is_null(row) {
        return Err("null value".into());
    }
    match col.data_type() {
        DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(_, _) => {
            let child = list_child(col, row)?;
            let mut values = Vec::new();
            let mut inner_shape: Option<Vec<i64>> = None;
            for i in 0..child.len() {
                let (v, s) = flatten_numbers(child.as_ref(), i)?;
                match &inner_shape {
                    Some(prev) if *prev != s => return Err("ragged nested list".into()),
                    Some(_) => {}
                    None => inner_shape = Some(s),
                }
                values.extend(v);
            }
            let mut shape = vec![child.len() as i64];
            shape.extend(inner_shape.unwrap_or_default());
            Ok((values, shape))
        }
        _ => {
            let one = col.slice(row, 1);
            let v = cast(&one, &DataType::Float64).map_err(|e| e.to_string())?;
            Ok((vec![v.as_primitive::<Float64Type>().value(0)], vec![]))
        }
    }
}

fn list_child(col: &dyn Array, row: usize) -> Result<ArrayRef, String> {
    Ok(match col.data_type() {
        DataType::List(_) => col.as_list::<i32>().value(row),
        DataType::LargeList(_) => col.as_list::<i64>().value(row),
        DataType::FixedSizeList(_, _) => col.as_fixed_size_list().value(row),
        other => return Err(format!("not a list: {other}")),
    })
}

/// Flattens a JSON number or nested list of numbers, with its shape.
pub fn flatten_json(value: &serde_json::Value) -> Result<(Vec<f64>, Vec<i64>), String> {
    match value {
        serde_json::Value::Number(n) => Ok((vec![n.as_f64().unwrap_or(f64::NAN)], vec![])),
        serde_json::Value::String(_) if lake_schemas::pyjson::as_f64(value).is_some() => {
            Ok((vec![lake_schemas::pyjson::as_f64(value).expect("checked")], vec![]))
        }
        serde_json::Value::Array(items) => {
            let mut values = Vec::new();
            let mut inner: Option<Vec<i64>> = None;
            for item in items {
                let (v, s) = flatten_json(item)?;
                match &inner {
                    Some(prev) if *prev != s => return Err("ragged nested list".into()),
                    Some(_) => {}
                    None => inner = Some(s),
                }
                values.extend(v);
            }
            let mut shape = vec![items.len() as i64];
            shape.extend(inner.unwrap_or_default());
            Ok((values, shape))
        }
        other => Err(format!("expected numbers, found {other}")),
    }
}

/// Builders mark list items and struct fields nullable their own way; cast to the table schema.
pub(crate) fn cast_to_schema(
    columns: Vec<arrow::array::ArrayRef>,
    schema: &arrow::datatypes::SchemaRef,
) -> crate::Result<Vec<arrow::array::ArrayRef>> {
    columns
        .into_iter()
        .zip(schema.fields())
        .map(|(c, f)| {
            if c.data_type() == f.data_type() {
                Ok(c)
            } else {
                arrow::compute::cast(&c, f.data_type()).map_err(crate::Error::arrow("schema cast"))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Float32Array, ListArray};
    use arrow::datatypes::Float32Type;

    use super::*;

    #[test]
    fn flattens_nested_lists_and_json() {
        let inner =
            ListArray::from_iter_primitive::<Float32Type, _, _>(vec![Some(vec![Some(1.0), Some(2.0)]), Some(vec![Some(3.0), Some(4.0)])]);
        let offsets = arrow::buffer::OffsetBuffer::new(vec![0i32, 2].into());
        let outer =
            ListArray::new(Arc::new(arrow::datatypes::Field::new("item", inner.data_type().clone(), true)), offsets, Arc::new(inner), None);
        let (values, shape) = flatten_numbers(&outer, 0).unwrap();
        assert_eq!(values, [1.0, 2.0, 3.0, 4.0]);
        assert_eq!(shape, [2, 2]);
        let scalar = Float32Array::from(vec![0.5]);
        assert_eq!(flatten_numbers(&scalar, 0).unwrap(), (vec![0.5], vec![]));

        let json: serde_json::Value = serde_json::from_str("[[[0.1]], [[0.2]], [[0.3]]]").unwrap();
        let (values, shape) = flatten_json(&json).unwrap();
        assert_eq!(shape, [3, 1, 1]);
        assert_eq!(values.len(), 3);
        assert!(flatten_json(&serde_json::json!([[1], [1, 2]])).is_err());
    }
}
