//! Values no query may build: a scalar function's result for one batch is at most
//! [`MAX_VALUE_BYTES`].
//!
//! DataFusion's memory pool counts what operators hold (sorts, joins, aggregations), not what a
//! scalar function allocates for its result: `repeat('x', 1500000000)` built 1.5 GB in one call,
//! beyond any pool and out of reach of a cancel. So the functions whose result can be far
//! larger than their arguments estimate their result from the arguments and refuse before they
//! allocate (`repeat`, `lpad`, `rpad`, `replace`, `regexp_replace`, `array_repeat`,
//! `array_resize`, `range`, `generate_series`); those whose result is at most the sum of their
//! arguments (`concat`, `||`, `array_concat`, …) refuse what reaches past the limit through
//! such a sum, before they allocate too. A chain of them (`WITH` tables each doubling a string)
//! stops at the limit instead of doubling on.

use std::sync::Arc;

use arrow::{
    array::{Array, ArrayRef, AsArray},
    datatypes::{DataType, FieldRef, Int64Type},
};
use datafusion::{
    common::{DFSchema, ScalarValue, exec_err, plan_err},
    error::Result,
    execution::FunctionRegistry,
    logical_expr::{
        ColumnarValue, Documentation, Expr, ExprSchemable, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
        Volatility,
        expr::ScalarFunction,
        planner::{ExprPlanner, PlannerResult, RawBinaryExpr},
        simplify::{ExprSimplifyResult, SimplifyContext},
        sort_properties::{ExprProperties, SortProperties},
        udf_eq::UdfEq,
    },
    prelude::SessionContext,
    sql::sqlparser::ast::BinaryOperator,
};

/// The most bytes one call of a scalar function may return (the values of one batch).
pub const MAX_VALUE_BYTES: u64 = 256 << 20;

/// How a function's result is sized from its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Size {
    /// `repeat(s, n)`: `s` n times.
    Repeat,
    /// `lpad(s, n [, fill])`, `rpad`: n characters, at most 4 bytes each.
    Pad,
    /// `replace(s, from, to)`: each `from` in `s` becomes `to`.
    Replace,
    /// `regexp_replace(s, pattern, replacement [, flags])`: a replacement (with its group
    /// references) at each match, and matches at most one per byte.
    RegexpReplace,
    /// `array_repeat(element, n)`: n elements.
    ArrayRepeat,
    /// `array_resize(array, n [, fill])`: n elements.
    ArrayResize,
    /// `range(start, stop [, step])`, `generate_series`: one element per step, of integers, or
    /// of dates and timestamps by an interval (other types are sized by their result).
    Range,
    /// At most the sum of the arguments (`concat`, `array_concat`, …).
    Sum,
}

/// The functions sized before they run, by name.
const SIZED: [(&str, Size); 20] = [
    ("repeat", Size::Repeat),
    ("lpad", Size::Pad),
    ("rpad", Size::Pad),
    ("replace", Size::Replace),
    ("regexp_replace", Size::RegexpReplace),
    ("array_repeat", Size::ArrayRepeat),
    ("array_resize", Size::ArrayResize),
    ("range", Size::Range),
    ("generate_series", Size::Range),
    ("concat", Size::Sum),
    ("concat_ws", Size::Sum),
    ("overlay", Size::Sum),
    ("translate", Size::Sum),
    ("array_concat", Size::Sum),
    ("array_append", Size::Sum),
    ("array_prepend", Size::Sum),
    ("array_union", Size::Sum),
    ("make_array", Size::Sum),
    ("encode", Size::Sum),
    ("to_hex", Size::Sum),
];

/// Replaces the session's sizeable functions with capped ones, and plans `||` with them.
pub fn install(ctx: &SessionContext) -> SessionContext {
    for (name, size) in SIZED {
        if let Ok(udf) = ctx.udf(name) {
            ctx.register_udf(ScalarUDF::new_from_impl(Capped { inner: UdfEq::from(udf.inner().clone()), size }));
        }
    }
    let capped = |name: &str| ctx.udf(name).ok();
    let planner = ConcatPlanner {
        strings: Arc::new(ScalarUDF::new_from_impl(ConcatOp::default())),
        array_concat: capped("array_concat"),
        array_append: capped("array_append"),
        array_prepend: capped("array_prepend"),
    };
    // Ahead of DataFusion's own planners, which plan `||` of lists with uncapped functions.
    let state = ctx.state();
    let planners: Vec<Arc<dyn ExprPlanner>> =
        std::iter::once(Arc::new(planner) as Arc<dyn ExprPlanner>).chain(state.expr_planners().iter().cloned()).collect();
    let state = datafusion::execution::SessionStateBuilder::new_from_existing(state).with_expr_planners(planners).build();
    SessionContext::new_with_state(state)
}

/// A refusal of a result past [`MAX_VALUE_BYTES`].
fn too_large<T>(name: &str, bytes: u64) -> Result<T> {
    Err(datafusion::error::DataFusionError::ResourcesExhausted(format!(
        "{name} would build {bytes} bytes in one call, over the limit of {MAX_VALUE_BYTES} bytes (256 MiB) the values of a \
         batch may take"
    )))
}

/// One value per row, or one for every row.
enum PerRow<T> {
    Each(Vec<T>),
    All(T),
}

impl<T: Copy> PerRow<T> {
    fn get(&self, row: usize) -> T {
        match self {
            Self::Each(values) => values[row],
            Self::All(value) => *value,
        }
    }
}

/// The byte length of each row's value (0 for null): strings and binaries by their bytes,
/// lists by their elements' memory, anything else by its memory.
fn byte_lengths(value: &ColumnarValue, rows: usize) -> PerRow<u64> {
    match value {
        ColumnarValue::Scalar(scalar) => PerRow::All(scalar_bytes(scalar)),
        ColumnarValue::Array(array) => PerRow::Each((0..array.len()).map(|row| row_bytes(array, row, rows)).collect()),
    }
}

fn scalar_bytes(scalar: &ScalarValue) -> u64 {
    match scalar {
        ScalarValue::Utf8(s) | ScalarValue::LargeUtf8(s) | ScalarValue::Utf8View(s) => s.as_ref().map_or(0, |s| s.len() as u64),
        ScalarValue::Binary(b) | ScalarValue::LargeBinary(b) | ScalarValue::BinaryView(b) => b.as_ref().map_or(0, |b| b.len() as u64),
        other => other.size() as u64,
    }
}

fn row_bytes(array: &ArrayRef, row: usize, rows: usize) -> u64 {
    if array.is_null(row) {
        return 0;
    }
    match array.data_type() {
        DataType::Utf8 => array.as_string::<i32>().value(row).len() as u64,
        DataType::LargeUtf8 => array.as_string::<i64>().value(row).len() as u64,
        DataType::Utf8View => array.as_string_view().value(row).len() as u64,
        DataType::Binary => array.as_binary::<i32>().value(row).len() as u64,
        DataType::LargeBinary => array.as_binary::<i64>().value(row).len() as u64,
        DataType::List(_) => array.as_list::<i32>().value(row).get_array_memory_size() as u64,
        DataType::LargeList(_) => array.as_list::<i64>().value(row).get_array_memory_size() as u64,
        _ => (array.get_array_memory_size() / rows.max(1)) as u64,
    }
}

/// Each row's integer (None where null or not an integer).
fn integers(value: &ColumnarValue) -> PerRow<Option<i64>> {
    match value {
        ColumnarValue::Scalar(scalar) => PerRow::All(scalar.cast_to(&DataType::Int64).ok().and_then(|s| match s {
            ScalarValue::Int64(v) => v,
            _ => None,
        })),
        ColumnarValue::Array(array) => match arrow::compute::cast(array, &DataType::Int64) {
            Ok(ints) => {
                let ints = ints.as_primitive::<Int64Type>();
                PerRow::Each((0..ints.len()).map(|row| ints.is_valid(row).then(|| ints.value(row))).collect())
            }
            Err(_) => PerRow::All(None),
        },
    }
}

/// Each row's instant in nanoseconds since the epoch, for dates and timestamps (None where
/// null, or for other types).
fn instants(value: &ColumnarValue) -> PerRow<Option<i128>> {
    use arrow::datatypes::TimeUnit;
    let per_unit: i128 = match value.data_type() {
        DataType::Date32 => 86_400_000_000_000,
        DataType::Date64 | DataType::Timestamp(TimeUnit::Millisecond, _) => 1_000_000,
        DataType::Timestamp(TimeUnit::Second, _) => 1_000_000_000,
        DataType::Timestamp(TimeUnit::Microsecond, _) => 1_000,
        DataType::Timestamp(TimeUnit::Nanosecond, _) => 1,
        _ => return PerRow::All(None),
    };
    let scale = |v: Option<i64>| v.map(|v| i128::from(v) * per_unit);
    match integers(value) {
        PerRow::All(v) => PerRow::All(scale(v)),
        PerRow::Each(values) => PerRow::Each(values.into_iter().map(scale).collect()),
    }
}

/// Each row's interval as the least and the most nanoseconds it can span: a month 28 to 31
/// days, a day 23 to 25 hours (across a change of clocks). None where null or not an interval.
fn step_spans(value: &ColumnarValue) -> PerRow<Option<(i128, i128)>> {
    use arrow::datatypes::{IntervalMonthDayNano, IntervalMonthDayNanoType, IntervalUnit};
    const DAY: i128 = 86_400_000_000_000;
    const HOUR: i128 = 3_600_000_000_000;
    let span = |IntervalMonthDayNano { months, days, nanoseconds }: IntervalMonthDayNano| {
        let bounds = |n: i32, short: i128, long: i128| {
            if n >= 0 { (i128::from(n) * short, i128::from(n) * long) } else { (i128::from(n) * long, i128::from(n) * short) }
        };
        let (months, days) = (bounds(months, 28 * DAY, 31 * DAY), bounds(days, 23 * HOUR, 25 * HOUR));
        (months.0 + days.0 + i128::from(nanoseconds), months.1 + days.1 + i128::from(nanoseconds))
    };
    let target = DataType::Interval(IntervalUnit::MonthDayNano);
    if !matches!(value.data_type(), DataType::Interval(_)) {
        return PerRow::All(None);
    }
    match value {
        ColumnarValue::Scalar(scalar) => PerRow::All(match scalar.cast_to(&target) {
            Ok(ScalarValue::IntervalMonthDayNano(v)) => v.map(span),
            _ => None,
        }),
        ColumnarValue::Array(array) => match arrow::compute::cast(array, &target) {
            Ok(steps) => {
                let steps = steps.as_primitive::<IntervalMonthDayNanoType>();
                PerRow::Each((0..steps.len()).map(|row| steps.is_valid(row).then(|| span(steps.value(row)))).collect())
            }
            Err(_) => PerRow::All(None),
        },
    }
}

/// How many values a range of instants from `start` to `stop` by a step spanning `step` (least,
/// most nanoseconds) holds at most: the step that makes the least headway toward `stop`, taken
/// as one nanosecond where it may make none (a month less 30 days).
fn instants_between(start: i128, stop: i128, (least, most): (i128, i128)) -> u128 {
    let (least, most) = if stop >= start { (least, most) } else { (-most, -least) };
    if most <= 0 {
        // Every step leads away from `stop`: an empty range, or a refusal.
        return 0;
    }
    (stop - start).unsigned_abs() / least.max(1).unsigned_abs() + 1
}

/// Bytes a call's result would take at most, from its arguments.
fn estimate(size: Size, args: &[ColumnarValue], rows: usize) -> u64 {
    let rows = if args.iter().all(|a| matches!(a, ColumnarValue::Scalar(_))) { 1 } else { rows };
    let lengths: Vec<PerRow<u64>> = args.iter().map(|a| byte_lengths(a, rows)).collect();
    // A range's ends and step: as integers, and as instants and an interval.
    let (ends, instant_ends, steps) = if size == Size::Range {
        let ends: Vec<PerRow<Option<i64>>> = args.iter().take(3).map(integers).collect();
        (ends, args.iter().take(2).map(instants).collect(), args.get(2).map(step_spans))
    } else {
        (Vec::new(), Vec::new(), None)
    };
    let count = |i: usize, row: usize| -> u64 { args.get(i).map_or(Some(0), |a| integers(a).get(row)).map_or(0, |n| n.max(0) as u64) };
    let length = |i: usize, row: usize| lengths.get(i).map_or(0, |l| l.get(row));
    let mut total: u64 = 0;
    for row in 0..rows {
        let bytes = match size {
            Size::Repeat => length(0, row).saturating_mul(count(1, row)),
            Size::Pad => count(1, row).saturating_mul(4),
            Size::Replace => {
                let (s, from, to) = (length(0, row), length(1, row).max(1), length(2, row));
                s.saturating_add((s / from + 1).saturating_mul(to))
            }
            Size::RegexpReplace => {
                let (s, replacement) = (length(0, row), length(2, row));
                // Each match takes the replacement, whose group references (`\1`, `$1`) each
                // take at most the matched text: all matches together at most `s`.
                s.saturating_add((s + 1).saturating_mul(replacement)).saturating_add(replacement.saturating_mul(s))
            }
            Size::ArrayRepeat => count(1, row).saturating_mul(length(0, row).max(8)),
            Size::ArrayResize => count(1, row).saturating_mul(8).saturating_add(length(0, row)),
            Size::Range => {
                let at = |i: usize| ends.get(i).and_then(|e| e.get(row));
                let instant = |i: usize| instant_ends.get(i).and_then(|e| e.get(row));
                match (args.len(), at(0), at(1), at(2)) {
                    (3, ..) if instant(0).is_some() => match (instant(0), instant(1), steps.as_ref().and_then(|s| s.get(row))) {
                        (Some(start), Some(stop), Some(step)) => {
                            u64::try_from(instants_between(start, stop, step).saturating_mul(8)).unwrap_or(u64::MAX)
                        }
                        _ => 0,
                    },
                    (1, Some(stop), _, _) => (stop.max(0) as u64).saturating_mul(8),
                    (2, Some(start), Some(stop), _) => stop.abs_diff(start).saturating_mul(8),
                    (3, Some(start), Some(stop), Some(step)) if step != 0 => (stop.abs_diff(start) / step.unsigned_abs()).saturating_mul(8),
                    _ => 0,
                }
            }
            Size::Sum => (0..args.len()).map(|i| length(i, row)).fold(0u64, u64::saturating_add),
        };
        total = total.saturating_add(bytes);
    }
    total
}

/// What a result takes.
fn result_bytes(value: &ColumnarValue) -> u64 {
    match value {
        ColumnarValue::Scalar(scalar) => scalar.size() as u64,
        ColumnarValue::Array(array) => array.get_array_memory_size() as u64,
    }
}

/// A function that refuses to build a result past [`MAX_VALUE_BYTES`]; everything else is the
/// function's own.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Capped {
    inner: UdfEq<Arc<dyn ScalarUDFImpl>>,
    size: Size,
}

impl ScalarUDFImpl for Capped {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn display_name(&self, args: &[Expr]) -> Result<String> {
        #[allow(deprecated)]
        self.inner.display_name(args)
    }

    fn schema_name(&self, args: &[Expr]) -> Result<String> {
        self.inner.schema_name(args)
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        self.inner.return_type(arg_types)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        self.inner.return_field_from_args(args)
    }

    fn is_nullable(&self, args: &[Expr], schema: &dyn datafusion::common::ExprSchema) -> bool {
        #[allow(deprecated)]
        self.inner.is_nullable(args, schema)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let name = self.inner.name().to_string();
        let estimated = estimate(self.size, &args.args, args.number_rows);
        if estimated > MAX_VALUE_BYTES {
            return too_large(&name, estimated);
        }
        let result = self.inner.invoke_with_args(args)?;
        match result_bytes(&result) {
            bytes if bytes > MAX_VALUE_BYTES => too_large(&name, bytes),
            _ => Ok(result),
        }
    }

    fn with_updated_config(&self, config: &datafusion::common::config::ConfigOptions) -> Option<ScalarUDF> {
        let updated = self.inner.with_updated_config(config)?;
        Some(ScalarUDF::new_from_impl(Self { inner: UdfEq::from(updated.inner().clone()), size: self.size }))
    }

    fn simplify(&self, args: Vec<Expr>, info: &SimplifyContext) -> Result<ExprSimplifyResult> {
        // `concat` and `concat_ws` fold their literal arguments into one at planning: sized
        // first, as a call would be (`concat_ws` puts its delimiter between them).
        let literal = |e: &Expr| if let Expr::Literal(v, _) = e { scalar_bytes(v) } else { 0 };
        if self.size == Size::Sum {
            let mut folded = args.iter().map(literal).fold(0u64, u64::saturating_add);
            if self.name() == "concat_ws" {
                folded = folded.saturating_add(args.first().map_or(0, literal).saturating_mul(args.len() as u64));
            }
            if folded > MAX_VALUE_BYTES {
                return too_large(self.name(), folded);
            }
        }
        // What they fold to calls DataFusion's own function: capped again.
        Ok(match self.inner.simplify(args, info)? {
            ExprSimplifyResult::Simplified(Expr::ScalarFunction(call)) => {
                ExprSimplifyResult::Simplified(Expr::ScalarFunction(capped_call(call)))
            }
            other => other,
        })
    }

    fn short_circuits(&self) -> bool {
        self.inner.short_circuits()
    }

    fn conditional_arguments<'a>(&self, args: &'a [Expr]) -> Option<(Vec<&'a Expr>, Vec<&'a Expr>)> {
        self.inner.conditional_arguments(args)
    }

    fn evaluate_bounds(
        &self,
        input: &[&datafusion::logical_expr::interval_arithmetic::Interval],
    ) -> Result<datafusion::logical_expr::interval_arithmetic::Interval> {
        self.inner.evaluate_bounds(input)
    }

    fn propagate_constraints(
        &self,
        interval: &datafusion::logical_expr::interval_arithmetic::Interval,
        inputs: &[&datafusion::logical_expr::interval_arithmetic::Interval],
    ) -> Result<Option<Vec<datafusion::logical_expr::interval_arithmetic::Interval>>> {
        self.inner.propagate_constraints(interval, inputs)
    }

    fn output_ordering(&self, inputs: &[ExprProperties]) -> Result<SortProperties> {
        self.inner.output_ordering(inputs)
    }

    fn preserves_lex_ordering(&self, inputs: &[ExprProperties]) -> Result<bool> {
        self.inner.preserves_lex_ordering(inputs)
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        self.inner.coerce_types(arg_types)
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.inner.documentation()
    }
}

/// `call`, with its function capped where it is one of [`SIZED`] not capped yet.
fn capped_call(call: ScalarFunction) -> ScalarFunction {
    let already = (call.func.inner().as_ref() as &dyn std::any::Any).is::<Capped>();
    match SIZED.iter().find(|(name, _)| *name == call.func.name()) {
        Some(&(_, size)) if !already => {
            let capped = ScalarUDF::new_from_impl(Capped { inner: UdfEq::from(call.func.inner().clone()), size });
            ScalarFunction::new_udf(Arc::new(capped), call.args)
        }
        _ => call,
    }
}

/// `a || b` of strings: null where either is null (unlike `concat`), capped as `concat` is.
#[derive(Debug, PartialEq, Eq, Hash)]
struct ConcatOp {
    signature: Signature,
}

impl Default for ConcatOp {
    fn default() -> Self {
        Self { signature: Signature::user_defined(Volatility::Immutable) }
    }
}

impl ScalarUDFImpl for ConcatOp {
    fn name(&self) -> &str {
        "||"
    }

    fn display_name(&self, args: &[Expr]) -> Result<String> {
        Ok(args.iter().map(ToString::to_string).collect::<Vec<_>>().join(" || "))
    }

    fn schema_name(&self, args: &[Expr]) -> Result<String> {
        let names = args.iter().map(|a| a.schema_name().to_string()).collect::<Vec<_>>();
        Ok(names.join(" || "))
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        if arg_types.len() != 2 {
            return plan_err!("|| takes two operands");
        }
        Ok(vec![string_type(arg_types); 2])
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        Ok(string_type(arg_types))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let estimated = estimate(Size::Sum, &args.args, args.number_rows);
        if estimated > MAX_VALUE_BYTES {
            return too_large("||", estimated);
        }
        let [left, right] = args.args.as_slice() else { return exec_err!("|| takes two operands") };
        let scalars = matches!((left, right), (ColumnarValue::Scalar(_), ColumnarValue::Scalar(_)));
        let rows = if scalars { 1 } else { args.number_rows };
        let joined = arrow::compute::kernels::concat_elements::concat_elements_dyn(&left.to_array(rows)?, &right.to_array(rows)?)?;
        if scalars { Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(&joined, 0)?)) } else { Ok(ColumnarValue::Array(joined)) }
    }
}

/// The string type both operands of `||` become: the widest of theirs.
fn string_type(arg_types: &[DataType]) -> DataType {
    if arg_types.contains(&DataType::LargeUtf8) {
        DataType::LargeUtf8
    } else if arg_types.contains(&DataType::Utf8View) {
        DataType::Utf8View
    } else {
        DataType::Utf8
    }
}

/// Plans `||` with capped functions: [`ConcatOp`] for strings, the capped `array_concat`,
/// `array_append` and `array_prepend` for lists; binaries are left to DataFusion.
#[derive(Debug)]
struct ConcatPlanner {
    strings: Arc<ScalarUDF>,
    array_concat: Option<Arc<ScalarUDF>>,
    array_append: Option<Arc<ScalarUDF>>,
    array_prepend: Option<Arc<ScalarUDF>>,
}

impl ExprPlanner for ConcatPlanner {
    fn plan_binary_op(&self, expr: RawBinaryExpr, schema: &DFSchema) -> Result<PlannerResult<RawBinaryExpr>> {
        if expr.op != BinaryOperator::StringConcat {
            return Ok(PlannerResult::Original(expr));
        }
        let (left, right) = (expr.left.get_type(schema)?, expr.right.get_type(schema)?);
        let dims = |t: &DataType| {
            let mut t = t.clone();
            let mut n = 0;
            while let DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) = t {
                t = f.data_type().clone();
                n += 1;
            }
            n
        };
        let binary =
            |t: &DataType| matches!(t, DataType::Binary | DataType::LargeBinary | DataType::BinaryView | DataType::FixedSizeBinary(_));
        let function = match (dims(&left), dims(&right)) {
            (0, 0) if binary(&left) || binary(&right) => None,
            (0, 0) => Some(&self.strings),
            (l, r) if l == r => self.array_concat.as_ref(),
            (l, r) if l > r => self.array_append.as_ref(),
            _ => self.array_prepend.as_ref(),
        };
        Ok(match function {
            Some(function) => {
                PlannerResult::Planned(Expr::ScalarFunction(ScalarFunction::new_udf(function.clone(), vec![expr.left, expr.right])))
            }
            None => PlannerResult::Original(expr),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i128 = 86_400_000_000_000;

    fn interval(months: i32, days: i32, nanoseconds: i64) -> ColumnarValue {
        ColumnarValue::Scalar(ScalarValue::IntervalMonthDayNano(Some(arrow::datatypes::IntervalMonthDayNano { months, days, nanoseconds })))
    }

    #[test]
    fn a_range_of_instants_is_sized_by_the_step_that_makes_the_least_headway() {
        let span = |months, days, nanos| step_spans(&interval(months, days, nanos)).get(0).expect("an interval");
        assert_eq!(span(1, 0, 0), (28 * DAY, 31 * DAY));
        assert_eq!(span(-1, 2, 5), (-31 * DAY + 46 * DAY / 24 + 5, -28 * DAY + 50 * DAY / 24 + 5));
        // A year of days: 366 values, and as many by a step of a day less an hour.
        let year = 365 * DAY;
        assert_eq!(instants_between(0, year, span(0, 1, 0)), 365 * 24 / 23 + 1);
        assert_eq!(instants_between(0, year, span(0, 0, 86_400_000_000_000)), 366);
        assert_eq!(instants_between(year, 0, span(0, 0, -86_400_000_000_000)), 366);
        // Steps away from the end make nothing; a step that may make no headway counts by the
        // nanosecond.
        assert_eq!(instants_between(0, year, span(0, -1, 0)), 0);
        assert_eq!(instants_between(year, 0, span(1, 0, 0)), 0);
        assert_eq!(instants_between(0, 1000, span(1, -30, 0)), 1001);
        assert_eq!(instants_between(5, 5, span(0, 0, 1)), 1);
    }

    #[test]
    fn dates_and_timestamps_are_instants_in_nanoseconds() {
        use arrow::datatypes::TimeUnit;
        let at = |v: ScalarValue| instants(&ColumnarValue::Scalar(v)).get(0);
        assert_eq!(at(ScalarValue::Date32(Some(2))), Some(2 * DAY));
        assert_eq!(at(ScalarValue::TimestampSecond(Some(-3), None)), Some(-3_000_000_000));
        assert_eq!(at(ScalarValue::TimestampMicrosecond(Some(7), Some("UTC".into()))), Some(7_000));
        assert_eq!(at(ScalarValue::Int64(Some(7))), None);
        assert_eq!(at(ScalarValue::TimestampNanosecond(None, None)), None);
        let stamps = arrow::array::TimestampMillisecondArray::from(vec![Some(1), None]);
        let column = ColumnarValue::Array(Arc::new(stamps));
        assert_eq!(column.data_type(), DataType::Timestamp(TimeUnit::Millisecond, None));
        let each = instants(&column);
        assert_eq!((each.get(0), each.get(1)), (Some(1_000_000), None));
    }
}
