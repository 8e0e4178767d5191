//! SQL over the lake: a DataFusion session whose tables are the lake's Lance tables.
//!
//! Naming (what `lake sql` and Flight SQL clients see):
//!
//! - `datasets`: one row per dataset (its latest version); `views`: the named training sets.
//! - `steps`, `episodes`, `tasks`, `stats`, `feature_stats`, `image_stats`, `findings`, `streams`,
//!   `packets`:
//!   every dataset's table of that name, stacked, with a leading `dataset` column. Columns are
//!   matched by name; a column some datasets lack is null there, and a column whose type differs
//!   between datasets is widened (numbers to `double`, vectors to `list<double>`); one whose types
//!   cannot be reconciled (`packet_row` of datasets with different cameras) is left out there and
//!   stays in each dataset's own table.
//! - `"<dataset>".<table>`: one dataset's table with its own exact types, in a schema named after
//!   the dataset (quote names holding `-` or `.`, e.g. `"v30-av1-small".steps`);
//!   `"<dataset>@<version>".<table>` reads an earlier version.
//!
//! Columns carry LeRobot's keys (`"observation.state"`, quoted because of the dot); vectors are
//! `FixedSizeList`s usable with DataFusion's array functions (`action[1]` is the first element).
//! Every table is a view over a Lance scan, so projections and filters reach Lance: `SELECT
//! count(*) FROM steps WHERE dataset = 'x'` reads one column of one dataset's steps and never a
//! video packet.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use arrow::{
    array::{ArrayRef, Float64Array, Int64Array, RecordBatch, RecordBatchOptions, StringArray, TimestampMicrosecondArray, UInt64Array},
    datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit},
};
use datafusion::{
    catalog::Session,
    catalog::{MemorySchemaProvider, SchemaProvider},
    common::Statistics,
    common::{Column, ScalarValue, TableReference},
    datasource::{MemTable, TableProvider, TableType, ViewTable, empty::EmptyTable, provider_as_source},
    execution::context::SQLOptions,
    execution::{SendableRecordBatchStream, TaskContext},
    logical_expr::{Expr, LogicalPlan, LogicalPlanBuilder, TableProviderFilterPushDown, cast, lit},
    physical_expr::EquivalenceProperties,
    physical_plan::{
        DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties, stream::RecordBatchStreamAdapter,
    },
    prelude::{DataFrame, SessionConfig, SessionContext},
};
use futures::{StreamExt, TryStreamExt};
use lake_schemas::{CommitRecord, ViewRecord, tables};
use lake_store::{Lake, without_source_locations};
use lance::datafusion::LanceTableProvider;

use crate::{Error, Result};

pub mod capped;
pub mod limits;
pub mod memory;

pub use memory::SqlMemory;

/// The catalog every lake table lives in.
pub const CATALOG: &str = "lake";
/// The schema holding the tables that span every dataset.
pub const SCHEMA: &str = "public";
/// Tables every dataset version has (those a version lacks are skipped), in listing order.
pub const DATASET_TABLES: [&str; 9] = [
    tables::STEPS,
    tables::EPISODES,
    tables::TASKS,
    tables::STATS,
    tables::FEATURE_STATS,
    tables::IMAGE_STATS,
    tables::FINDINGS,
    tables::STREAMS,
    tables::PACKETS,
];

fn query_error(e: datafusion::error::DataFusionError) -> Error {
    sql_error(&e)
}

/// Runs `work` on a thread named `name` whose stack holds a query at the nesting limit
/// ([`limits::STACK_BYTES`]), in a runtime of its own: how a server, whose runtime's threads have
/// ordinary stacks, plans a query or walks one. Dropping the answer's future stops `work`. A
/// panic of `work` is its error, and one line of the log, not a backtrace.
///
/// # Errors
/// `work`'s; [`Error::Internal`] when the thread cannot start or stops without an answer.
pub async fn apart<T, F, Fut>(name: &str, work: F) -> Result<T>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<T>>,
    T: Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(name.into())
        .stack_size(limits::STACK_BYTES)
        .spawn(move || {
            // The engine's panics here become the query's error ([`planning`], [`unwinding`]).
            lake_store::log_panics_on_this_thread();
            let mut tx = tx;
            let answer = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                // A caller that goes away stops the work (a client that gave up).
                Ok(runtime) => runtime.block_on(async {
                    tokio::select! {
                        answer = planning(work()) => Some(answer),
                        () = tx.closed() => None,
                    }
                }),
                Err(e) => Some(Err(Error::Internal(format!("cannot start a runtime for the query: {e}")))),
            };
            if let Some(answer) = answer {
                let _ = tx.send(answer);
            }
        })
        .map_err(|e| Error::Internal(format!("cannot start a thread for the query: {e}")))?;
    rx.await.map_err(|_| Error::Internal(format!("the query's thread `{name}` stopped without an answer")))?
}

/// A failed query as lake's error: [`Error::StoreUnavailable`] when the lake's object store could
/// not be reached, [`Error::Storage`] when reading the lake's files failed otherwise (an I/O,
/// object store or Lance error at the root of the chain), [`Error::Query`] when the query
/// itself is wrong or failed on the values (parse, plan, schema, a cast or a division by zero).
pub fn sql_error(e: &datafusion::error::DataFusionError) -> Error {
    use datafusion::{arrow::error::ArrowError, error::DataFusionError as D};
    // A server shutting down stopped the query.
    if let D::External(inner) = e.find_root()
        && let Some(Error::ShuttingDown) = inner.downcast_ref::<Error>()
    {
        return Error::ShuttingDown;
    }
    // A syntax error as its words, not its Rust debug form (`SQL error: ParserError("…")`).
    if let D::SQL(parse, _) = e.find_root() {
        if matches!(**parse, datafusion::sql::sqlparser::parser::ParserError::RecursionLimitExceeded) {
            return Error::Query(limits::Refused::TooDeepToParse.to_string());
        }
        let text = parse.to_string();
        let text = text.strip_prefix("sql parser error: ").or_else(|| text.strip_prefix("sql tokenizer error: ")).unwrap_or(&text);
        return Error::Query(format!("SQL syntax error: {text}"));
    }
    let message = without_source_locations(e.strip_backtrace().trim());
    if ["DDL not supported", "DML not supported", "Statement not supported"].iter().any(|m| message.contains(m)) {
        return Error::Query(format!(
            "lake answers queries only (SELECT, WITH, EXPLAIN, SHOW, DESCRIBE): no tables are made or changed, and an answer is \
             written with `lake sql --output FILE` ({message})"
        ));
    }
    // A value the lake's tables refuse (a filter with more conditions than Lance takes) is the
    // query's fault, not the lake's.
    if let D::External(inner) = e.find_root()
        && let Some(refusal @ lance::Error::InvalidInput { .. }) = inner.downcast_ref::<lance::Error>()
    {
        let text = without_source_locations(&refusal.to_string());
        let text = text.strip_prefix("Invalid user input: ").unwrap_or(&text).trim_end_matches([',', ' ']);
        return Error::Query(format!("the lake's tables cannot take this query: {text}"));
    }
    if let D::ResourcesExhausted(what) = e.find_root() {
        return Error::ResourcesExhausted(format!("resources exhausted: {}", without_source_locations(what)));
    }
    if crate::store_unreachable(e) {
        return Error::StoreUnavailable(message);
    }
    // The optimizer rewrites the query and reads no file: what fails there is the query (a
    // pattern that is no regular expression).
    if rewritten_by_optimizer(e) {
        return Error::Query(message);
    }
    // A damaged file of the lake in lake's words, as every other command names it.
    if let D::External(inner) = e.find_root()
        && let Some(damaged @ lance::Error::CorruptFile { .. }) = inner.downcast_ref::<lance::Error>()
    {
        return Error::Storage(lake_store::lance_message(damaged));
    }
    match e.find_root() {
        D::External(_) | D::IoError(_) | D::ObjectStore(_) | D::Internal(_) | D::ExecutionJoin(_) => Error::Storage(message),
        D::ArrowError(arrow, _) if matches!(**arrow, ArrowError::IoError(..) | ArrowError::ExternalError(_)) => Error::Storage(message),
        _ => Error::Query(message),
    }
}

/// Whether `e` arose in one of DataFusion's optimizer rules.
fn rewritten_by_optimizer(mut e: &datafusion::error::DataFusionError) -> bool {
    use datafusion::error::DataFusionError as D;
    loop {
        e = match e {
            D::Context(what, _) if what.starts_with("Optimizer rule ") => return true,
            D::Context(_, inner) | D::Diagnostic(_, inner) => inner,
            D::Shared(inner) => inner,
            _ => return false,
        };
    }
}

/// A DataFusion session over one state of the lake (the latest version of every dataset when
/// it was opened). Clones share the session.
#[derive(Clone)]
pub struct LakeSql {
    ctx: SessionContext,
    lake: Lake,
    datasets: Vec<CommitRecord>,
    /// Datasets whose tables could not be opened (`NAME@VERSION`, why): left out of the session.
    unreadable: Vec<(String, String)>,
    /// Derived tables (made beside a version after its ingest) that could not be opened, and why.
    skipped_tables: Vec<(&'static str, String)>,
    /// Datasets `lake rm` removed (their latest removal), to say so of a query naming one.
    removed: std::collections::BTreeMap<String, lake_store::Removal>,
    options: SQLOptions,
}

impl std::fmt::Debug for LakeSql {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LakeSql").field("datasets", &self.datasets.len()).finish_non_exhaustive()
    }
}

/// One table of the session, for listings (`\d`).
#[derive(Debug, Clone)]
pub struct TableInfo {
    /// The schema (`public` or a dataset name).
    pub schema: String,
    /// The table name.
    pub name: String,
    /// Its columns.
    pub columns: SchemaRef,
}

impl LakeSql {
    /// Opens a session over the lake's current datasets and views.
    ///
    /// # Errors
    /// When the catalog or a table cannot be read.
    pub async fn open(lake: &Lake) -> Result<Self> {
        Self::open_with(lake, &OpenedTables::default(), &SqlMemory::new(SqlMemory::default_bytes())?).await
    }

    /// Opens a session as [`LakeSql::open`] does, taking the tables of dataset versions
    /// `opened` already holds from it, and keeping there those it opens (a server's sessions,
    /// one per query, open each version's tables once), its queries drawing from `memory`.
    ///
    /// # Errors
    /// As [`LakeSql::open`].
    pub async fn open_with(lake: &Lake, opened: &OpenedTables, memory: &SqlMemory) -> Result<Self> {
        let (datasets, unreadable_records) = lake.datasets_listed().await?;
        let (views, unreadable_views) = lake.views_listed().await?;
        let mut config = SessionConfig::new()
            .with_default_catalog_and_schema(CATALOG, SCHEMA)
            .with_information_schema(true)
            .with_target_partitions(std::thread::available_parallelism().map_or(2, usize::from));
        // Sorts run whole, not per partition and merged. DataFusion drops `dataset` from a
        // per-partition sort of a stacked table (it is constant in each dataset's partitions),
        // while the partitions' top-k heaps share one threshold: `ORDER BY dataset, index
        // LIMIT n` then let one dataset's indices cut another's rows, a wrong answer (and a
        // view made from it the wrong episodes).
        config.options_mut().optimizer.repartition_sorts = false;
        // Struct field reads (`packet_row['front']`) stay where the query has them. DataFusion
        // 54's leaf-expression pushdown fails to plan one above a projection that renames columns
        // ("Schema contains qualified field name … and unqualified field name …"), and a stacked
        // table is such a projection: stored `observation/state` read as `observation.state`
        // (apache/datafusion#25446).
        config.options_mut().optimizer.enable_leaf_expression_pushdown = false;
        config.options_mut().sql_parser.recursion_limit = limits::MAX_PARSER_DEPTH;
        // Planning errors then say where in the query they are (`Line: L, Column: C`).
        config.options_mut().sql_parser.collect_spans = true;
        let ctx = SessionContext::new_with_config_rt(config, memory.runtime());
        for function in crate::sql_functions::functions() {
            ctx.register_udf(function);
        }
        let ctx = capped::install(&ctx);
        let catalog = ctx.catalog(CATALOG).expect("the default catalog exists");

        // Per-dataset schemas: the tables under their own names, columns renamed to LeRobot keys.
        // A dataset whose tables cannot be opened is left out (and named when a query asks for
        // it), so that one damaged dataset does not take the others' SQL with it.
        let opened = opened.open(lake, &datasets).await;
        let mut stacked: BTreeMap<&str, Vec<(String, LogicalPlan)>> = BTreeMap::new();
        let (mut readable, mut unreadable) = (Vec::new(), Vec::new());
        for u in unreadable_records {
            unreadable.push((format!("{}@{}", u.name, u.version), format!("its catalog record {} cannot be read: {}", u.path, u.why)));
        }
        let mut skipped_tables: Vec<(&'static str, String)> = unreadable_views
            .into_iter()
            .map(|u| ("views", format!("view {}@{} is left out: its record {} cannot be read ({})", u.name, u.version, u.path, u.why)))
            .collect();
        for (record, tables) in datasets.iter().zip(opened) {
            let tables = match tables {
                Ok((tables, skipped)) => {
                    skipped_tables.extend(skipped);
                    tables
                }
                Err(e) => {
                    let spec = format!("{}@{}", record.name, record.version);
                    unreadable.push((spec, without_source_locations(&e.to_string())));
                    continue;
                }
            };
            // A dataset named as one of SQL's own schemas (allowed before those names were
            // reserved) has none of its own: `"NAME@VERSION".steps` and the stacked tables
            // read it.
            if !lake_store::RESERVED_NAMES.contains(&record.name.as_str()) {
                catalog.register_schema(&record.name, dataset_schema(&tables)?).map_err(query_error)?;
            }
            for (table, plan) in tables {
                stacked.entry(table).or_default().push((record.name.clone(), plan));
            }
            readable.push(record.clone());
        }

        // Tables spanning every dataset.
        let public = catalog.schema(SCHEMA).expect("the default schema exists");
        for table in DATASET_TABLES {
            let provider: Arc<dyn TableProvider> = match stacked.remove(table) {
                Some(plans) => Arc::new(ViewTable::new(stack(plans)?, None)),
                None => Arc::new(EmptyTable::new(empty_schema(table))),
            };
            public.register_table(table.to_string(), provider).map_err(query_error)?;
        }
        public.register_table("datasets".into(), Arc::new(mem_table(datasets_batch(&datasets))?)).map_err(query_error)?;
        public.register_table("views".into(), Arc::new(mem_table(views_batch(&views))?)).map_err(query_error)?;
        let removed = lake.removed_datasets().await?;
        Ok(Self { ctx, lake: lake.clone(), datasets: readable, unreadable, skipped_tables, removed, options: SQLOptions::new() })
    }

    /// Refuses every statement but queries: no DDL (`CREATE EXTERNAL TABLE` would read any file
    /// the process can), no DML (`COPY … TO` would write one), no `SET`. What a server offers.
    #[must_use]
    pub fn read_only(mut self) -> Self {
        self.options = SQLOptions::new().with_allow_ddl(false).with_allow_dml(false).with_allow_statements(false);
        self
    }

    /// Makes the tables that span every dataset (`steps`, `episodes`, …) refuse to answer
    /// while a dataset (or a derived table of one) cannot be read, instead of answering without
    /// it: what a server does, whose clients see no warning. Per-dataset tables of the readable
    /// datasets still answer.
    ///
    /// # Errors
    /// When the session's tables cannot be replaced.
    pub async fn whole_answers_only(self) -> Result<Self> {
        let public = self.ctx.catalog(CATALOG).and_then(|c| c.schema(SCHEMA)).expect("the default schema exists");
        for table in DATASET_TABLES {
            let mut missing: Vec<String> =
                self.unreadable.iter().map(|(spec, why)| format!("dataset {spec} cannot be read ({why})")).collect();
            missing.extend(self.skipped_tables.iter().filter(|(t, _)| *t == table).map(|(_, why)| why.clone()));
            if missing.is_empty() {
                continue;
            }
            let why = format!("{}; an answer over every dataset would leave it out", missing.join("; "));
            let Some(stacked) = public.table(table).await.map_err(query_error)? else { continue };
            let incomplete = Incomplete { schema: stacked.schema(), why };
            public.deregister_table(table).map_err(query_error)?;
            public.register_table(table.to_string(), Arc::new(incomplete)).map_err(query_error)?;
        }
        Ok(self)
    }

    /// The DataFusion session (for serving it over Flight SQL).
    pub fn context(&self) -> &SessionContext {
        &self.ctx
    }

    /// The dataset versions the session reads.
    pub fn datasets(&self) -> &[CommitRecord] {
        &self.datasets
    }

    /// The datasets whose tables could not be opened (`NAME@VERSION`, why), left out.
    pub fn unreadable(&self) -> &[(String, String)] {
        &self.unreadable
    }

    /// Derived tables of readable datasets (`image_stats`, made by `lake stats --images`) that
    /// could not be opened and are left out of the session, each with why.
    pub fn skipped_tables(&self) -> &[(&'static str, String)] {
        &self.skipped_tables
    }

    /// Plans `query` and streams its result.
    ///
    /// # Errors
    /// DataFusion's error (with the position for syntax errors) when the query is not valid; a
    /// message naming the dataset when it refers to one the lake does not have.
    pub async fn stream(&self, query: &str) -> Result<SendableRecordBatchStream> {
        let frame = self.plan(query).await?;
        Ok(unwinding(plain_answer(planning(async { frame.execute_stream().await.map_err(query_error) }).await?)))
    }

    /// The schema `query` would return, without running it.
    ///
    /// # Errors
    /// As [`LakeSql::stream`].
    pub async fn schema(&self, query: &str) -> Result<SchemaRef> {
        Ok(plain_schema(&Arc::new(self.plan(query).await?.schema().as_arrow().clone())))
    }

    /// [`LakeSql::schema`] on a thread of its own whose stack holds a query at the nesting
    /// limit ([`limits::STACK_BYTES`]): what a server calls from its runtime, whose threads have
    /// ordinary stacks.
    ///
    /// # Errors
    /// As [`LakeSql::schema`].
    pub async fn schema_apart(self, query: String) -> Result<SchemaRef> {
        apart("lake-sql-plan", move || async move { self.schema(&query).await }).await
    }

    /// `query` parsed, checked against the limits and planned, a panic inside the engine
    /// included ([`planning`]).
    async fn plan(&self, query: &str) -> Result<DataFrame> {
        planning(self.plan_unguarded(query)).await
    }

    async fn plan_unguarded(&self, query: &str) -> Result<DataFrame> {
        let statement = self.parse(query)?;
        self.open_versions(&statement).await?;
        let state = self.ctx.state();
        let planned = match state.statement_to_plan(statement).await {
            Ok(plan) => self.options.verify_plan(&plan).map(|()| plan),
            Err(e) => Err(e),
        };
        let plan = planned.map_err(|e| self.explain_error(e))?;
        self.ctx.execute_logical_plan(plan).await.map_err(query_error)
    }

    /// Parses `query` into its one statement, refusing one too long or nested too deep for the
    /// planner ([`limits`]) before anything recurses over it.
    ///
    /// # Errors
    /// [`Error::Query`] for a syntax error (with its position) or a query over the limits.
    fn parse(&self, query: &str) -> Result<datafusion::sql::parser::Statement> {
        limits::check_length(query).map_err(|refused| Error::Query(refused.to_string()))?;
        let state = self.ctx.state();
        let dialect = state.config().options().sql_parser.dialect;
        let statement = state.sql_to_statement(query, &dialect).map_err(|e| match self.explain_error(e) {
            // The parser gives no position for what it missed at the end.
            Error::Query(m) if m.starts_with("SQL syntax error") && m.ends_with("found: EOF") => {
                let line = query.trim_end().lines().count().max(1);
                let column = query.trim_end().lines().last().map_or(0, |l| l.chars().count()) + 1;
                Error::Query(format!("{m} at the end of the query (Line: {line}, Column: {column})"))
            }
            e => e,
        })?;
        limits::check_depth(&statement).map_err(|refused| Error::Query(refused.to_string()))?;
        Ok(statement)
    }

    /// Opens the earlier version a table name (`"NAME@VERSION".steps`) refers to, if any, so
    /// that [`LakeSql::tables`] lists its tables.
    ///
    /// # Errors
    /// When the dataset has no such version, or its tables cannot be opened.
    pub async fn open_version_of(&self, table: &str) -> Result<()> {
        match self.parse(&format!("SELECT * FROM {table}")) {
            Ok(statement) => self.open_versions(&statement).await,
            Err(_) => Ok(()),
        }
    }

    /// Registers the schema of every earlier version the query names (`"NAME@VERSION".steps`)
    /// that the session has not opened yet.
    async fn open_versions(&self, statement: &datafusion::sql::parser::Statement) -> Result<()> {
        let Ok(references) = self.ctx.state().resolve_table_references(statement) else { return Ok(()) };
        let catalog = self.ctx.catalog(CATALOG).expect("the default catalog exists");
        for schema in references.iter().filter_map(TableReference::schema).filter(|s| s.contains('@')) {
            if catalog.schema(schema).is_some() {
                continue;
            }
            let record = self.lake.resolve(schema).await?;
            let (tables, _) = open_dataset(&self.lake, &record).await?;
            catalog.register_schema(schema, dataset_schema(&tables)?).map_err(query_error)?;
        }
        Ok(())
    }

    /// The dataset versions `query` reads, by dataset name: `"NAME@VERSION".t` that version,
    /// `"NAME".t` the latest, a table spanning every dataset every latest one. Empty for a
    /// query that does not parse.
    #[must_use]
    pub fn versions_read(&self, query: &str) -> BTreeMap<String, BTreeSet<u64>> {
        let mut read: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
        let Ok(statement) = self.parse(query) else { return read };
        let Ok(references) = self.ctx.state().resolve_table_references(&statement) else { return read };
        for reference in references {
            match reference.schema() {
                None | Some(SCHEMA) if DATASET_TABLES.contains(&reference.table()) => {
                    for d in &self.datasets {
                        read.entry(d.name.clone()).or_default().insert(d.version);
                    }
                }
                Some(schema) => {
                    let (name, version) = match schema.split_once('@') {
                        Some((name, v)) => (name, lake_store::parse_version(v)),
                        None => (schema, self.datasets.iter().find(|d| d.name == schema).map(|d| d.version)),
                    };
                    if let Some(version) = version {
                        read.entry(name.to_string()).or_default().insert(version);
                    }
                }
                None => {}
            }
        }
        read
    }

    /// Runs `query` and collects its result.
    ///
    /// # Errors
    /// As [`LakeSql::stream`].
    pub async fn query(&self, query: &str) -> Result<(SchemaRef, Vec<RecordBatch>)> {
        let stream = self.stream(query).await?;
        let schema = stream.schema();
        let batches = stream.try_collect().await.map_err(query_error)?;
        Ok((schema, batches))
    }

    /// Every table, spanning tables first, then each dataset's.
    pub async fn tables(&self) -> Result<Vec<TableInfo>> {
        let catalog = self.ctx.catalog(CATALOG).expect("the default catalog exists");
        let mut names = catalog.schema_names();
        names.sort_by_key(|s| (s != SCHEMA, s.clone()));
        let mut out = Vec::new();
        for schema_name in names {
            let schema = catalog.schema(&schema_name).expect("listed schema exists");
            let mut tables = schema.table_names();
            tables.sort_by_key(|t| (DATASET_TABLES.iter().position(|d| d == t).unwrap_or(usize::MAX), t.clone()));
            for name in tables {
                if let Some(table) = schema.table(&name).await.map_err(query_error)? {
                    out.push(TableInfo { schema: schema_name.clone(), name, columns: table.schema() });
                }
            }
        }
        Ok(out)
    }

    /// Turns "table not found" for a `<dataset>.<table>` reference into a message naming the
    /// missing dataset and those the lake has.
    fn explain_error(&self, e: datafusion::error::DataFusionError) -> Error {
        let at = e.diagnostic().and_then(|d| d.span).map(|span| span.start).filter(|start| start.line > 0);
        match (self.explain_error_words(e), at) {
            (Error::Query(m), Some(start)) if !m.contains("Line: ") => {
                Error::Query(format!("{m} (Line: {}, Column: {})", start.line, start.column))
            }
            (explained, _) => explained,
        }
    }

    /// [`Self::explain_error`] without the position.
    fn explain_error_words(&self, e: datafusion::error::DataFusionError) -> Error {
        if let Error::Storage(message) = sql_error(&e) {
            return Error::Storage(message);
        }
        let message = e.strip_backtrace().trim().to_string();
        if let Some(rest) = message.split("table '").nth(1)
            && message.contains("not found")
        {
            let reference = rest.split('\'').next().unwrap_or_default();
            // `lake.SCHEMA.TABLE`, where a dataset's schema may hold dots (`"my.data@2"`).
            let within = reference.strip_prefix(&format!("{CATALOG}.")).unwrap_or(reference);
            let (schema, table) = within.rsplit_once('.').unwrap_or((SCHEMA, within));
            let base = schema.split('@').next().unwrap_or(schema);
            if let Some((spec, why)) = self.unreadable.iter().find(|(spec, _)| spec.split('@').next() == Some(base)) {
                return Error::Storage(format!("dataset {spec} cannot be read: {why}"));
            }
            if let Some(d) = self.datasets.iter().find(|d| d.name == schema && lake_store::RESERVED_NAMES.contains(&schema)) {
                return Error::Query(format!(
                    "{message}: `{schema}` is SQL's own schema, not the dataset of that name (a name reserved since it was \
                     ingested); read the dataset as \"{schema}@{}\".{table}, or from {table} WHERE dataset = '{schema}'",
                    d.version
                ));
            }
            let tables_of = |schema: &str| -> String {
                let names = self.ctx.catalog(CATALOG).and_then(|c| c.schema(schema)).map(|s| s.table_names()).unwrap_or_default();
                let mut names: Vec<String> = names.into_iter().collect();
                names.sort();
                names.join(", ")
            };
            let known = self.ctx.catalog(CATALOG).is_some_and(|c| c.schema(schema).is_some());
            if schema != SCHEMA && !known {
                if std::path::Path::new(&self.lake.uri(&format!("views/{base}"))).is_dir() {
                    return Error::Query(format!(
                        "{message}: `{base}` is a view, not a dataset (`SELECT * FROM views WHERE view = '{base}'` shows its datasets and \
                         the query that selects its episodes)"
                    ));
                }
                // An unquoted name is folded to lower case.
                if let Some(d) = self.datasets.iter().find(|d| d.name != base && d.name.eq_ignore_ascii_case(base)) {
                    return Error::Query(format!(
                        "{message}: the lake has no dataset `{base}`; `{}` has capitals, which a name keeps only in double quotes: \
                         \"{}\".{table}",
                        d.name, d.name
                    ));
                }
                let have: Vec<&str> = self.datasets.iter().map(|d| d.name.as_str()).collect();
                let have = if have.is_empty() { "none yet".to_string() } else { have.join(", ") };
                return Error::Query(format!(
                    "{message}: the lake has no dataset `{base}` (datasets: {have}){}",
                    lake_store::removed_hint(self.removed.get(base))
                ));
            }
            let hint = if table == "image_stats" { "; `lake stats NAME --images` makes a dataset's image_stats" } else { "" };
            let whose = if schema == SCHEMA { "the lake's tables".to_string() } else { format!("`{schema}`'s tables") };
            return Error::Query(format!("{message} ({whose}: {}{hint})", tables_of(schema)));
        }
        sql_error(&e)
    }
}

/// One version's tables as plans renaming stored columns to LeRobot keys, and the derived
/// tables left out (with why).
type VersionTables = (Vec<(&'static str, LogicalPlan)>, Vec<(&'static str, String)>);

/// The identity (device, inode) of each derived table directory of a version (`None` where
/// absent).
type DerivedStamps = Vec<Option<(u64, u64)>>;

/// The opened tables of dataset versions, kept between sessions. A version's ingested tables
/// never change; a derived one (`image_stats`, published by renaming its directory into place)
/// is known by its directory's identity, so a version is opened again when one appears, goes or
/// is replaced. Versions no longer the latest of their dataset are let go, and a version with a
/// table left out is never kept (it is looked at again by the next session).
#[derive(Debug, Default)]
pub struct OpenedTables {
    versions: std::sync::Mutex<std::collections::HashMap<(String, u64), (DerivedStamps, VersionTables)>>,
}

impl OpenedTables {
    /// The tables of each of `records`, from what is kept where still current, else opened.
    async fn open(&self, lake: &Lake, records: &[CommitRecord]) -> Vec<Result<VersionTables>> {
        let stamps: Vec<DerivedStamps> = records.iter().map(|r| derived_stamps(lake, r)).collect();
        let kept: Vec<Option<VersionTables>> = {
            let mut versions = self.versions.lock().expect("opened tables lock");
            versions.retain(|(name, version), _| records.iter().any(|r| r.name == *name && r.version == *version));
            records
                .iter()
                .zip(&stamps)
                .map(|(r, stamp)| {
                    versions.get(&(r.name.clone(), r.version)).filter(|(had, _)| had == stamp).map(|(_, tables)| tables.clone())
                })
                .collect()
        };
        let opened = futures::future::join_all(records.iter().zip(kept).map(|(record, kept)| async move {
            match kept {
                Some(tables) => Ok(tables),
                None => open_dataset(lake, record).await,
            }
        }))
        .await;
        let mut versions = self.versions.lock().expect("opened tables lock");
        for ((record, stamp), tables) in records.iter().zip(stamps).zip(&opened) {
            if let Ok(tables) = tables
                && tables.1.is_empty()
            {
                versions.insert((record.name.clone(), record.version), (stamp, tables.clone()));
            }
        }
        opened
    }
}

/// The identity (device, inode) of each derived table directory `record`'s version has, in
/// [`DATASET_TABLES`] order (`None` where absent).
fn derived_stamps(lake: &Lake, record: &CommitRecord) -> DerivedStamps {
    use std::os::unix::fs::MetadataExt;
    DATASET_TABLES
        .iter()
        .filter(|t| !record.tables.tables.iter().any(|have| have == *t))
        .map(|t| std::fs::metadata(lake.uri(&record.tables.path(t))).ok().map(|m| (m.dev(), m.ino())))
        .collect()
}

/// A schema holding one version's tables.
fn dataset_schema(tables: &[(&'static str, LogicalPlan)]) -> Result<Arc<MemorySchemaProvider>> {
    let schema = Arc::new(MemorySchemaProvider::new());
    for (table, plan) in tables {
        schema.register_table(table.to_string(), Arc::new(ViewTable::new(plan.clone(), None))).map_err(query_error)?;
    }
    Ok(schema)
}

/// Opens the tables of one version and returns, per table, a plan that renames stored columns to
/// their LeRobot keys.
async fn open_dataset(lake: &Lake, record: &CommitRecord) -> Result<VersionTables> {
    let (mut out, mut skipped) = (Vec::new(), Vec::new());
    let ingested = |t: &str| record.tables.tables.iter().any(|have| have == t);
    // Ingest's tables, and derived ones a later command added beside the version.
    let present = |t: &str| ingested(t) || std::path::Path::new(&lake.uri(&record.tables.path(t))).is_dir();
    for table in DATASET_TABLES.into_iter().filter(|t| present(t)) {
        let path = record.tables.path(table);
        // A table removed or damaged outside lake would fail every query that stacks it, other
        // datasets' included: an ingested one takes its dataset out (the next ingest of the
        // source replaces the version), a derived one (`lake stats --images`) only itself.
        let opened = match lake_store::open_lance(&lake.uri(&path)).await {
            Ok(dataset) => match lake.data_file_damage(&path, &dataset).await? {
                None => Ok(dataset),
                Some(why) => Err(Error::Storage(format!("table {path}: {why}"))),
            },
            Err(source) => Err(Error::Open { table: path.clone(), error: Box::new(source) }),
        };
        let dataset = match opened {
            Ok(dataset) => dataset,
            Err(e) if !ingested(table) => {
                skipped.push((
                    table,
                    format!("table {table} of {}@{} is left out: {e} (`lake stats --images` makes it again)", record.name, record.version),
                ));
                continue;
            }
            Err(e) => return Err(e),
        };
        let lance = Arc::new(LanceTableProvider::new(Arc::new(dataset), false, false));
        let stored = lance.schema();
        let provider = Arc::new(PlainTable::new(lance, lake.uri(&path)));
        let exprs: Vec<Expr> = stored
            .fields()
            .iter()
            .map(|f| {
                let column = Expr::Column(Column::from_name(f.name()));
                let key = tables::lerobot_name(f);
                if key == f.name() { column } else { column.alias(key) }
            })
            .collect();
        let reference = TableReference::full(CATALOG, record.name.as_str(), table);
        let plan = LogicalPlanBuilder::scan(reference, provider_as_source(provider), None)
            .and_then(|b| b.project(exprs))
            .and_then(LogicalPlanBuilder::build)
            .map_err(query_error)?;
        out.push((table, plan));
    }
    Ok((out, skipped))
}

/// The type a column takes in a stacked table, given its type in each dataset that has it;
/// `None` when the types cannot be reconciled (the column is then left out of the stack).
fn unify(types: &[&DataType]) -> Option<DataType> {
    let first = types[0];
    if types.iter().all(|t| *t == first) {
        return Some(first.clone());
    }
    let item = |t: &DataType| match t {
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => Some(f.data_type().clone()),
        _ => None,
    };
    if types.iter().all(|t| t.is_numeric()) {
        return Some(DataType::Float64);
    }
    if types.iter().all(|t| item(t).is_some_and(|i| i.is_numeric())) {
        return Some(DataType::List(Arc::new(Field::new("item", DataType::Float64, true))));
    }
    if types.iter().all(|t| matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)) {
        return Some(DataType::Utf8);
    }
    None
}

/// Stacks one table of several datasets: a leading `dataset` column, columns matched by name.
fn stack(plans: Vec<(String, LogicalPlan)>) -> Result<LogicalPlan> {
    let mut columns: Vec<(String, Vec<DataType>)> = Vec::new();
    for (_, plan) in &plans {
        for field in plan.schema().fields() {
            match columns.iter_mut().find(|(n, _)| n == field.name()) {
                Some((_, types)) => types.push(field.data_type().clone()),
                None => columns.push((field.name().clone(), vec![field.data_type().clone()])),
            }
        }
    }
    let columns: Vec<(String, DataType)> =
        columns.into_iter().filter_map(|(name, types)| unify(&types.iter().collect::<Vec<_>>()).map(|t| (name, t))).collect();
    let mut builder: Option<LogicalPlanBuilder> = None;
    for (dataset, plan) in plans {
        let mut exprs = vec![lit(dataset).alias("dataset")];
        for (name, dt) in &columns {
            let expr = match plan.schema().field_with_unqualified_name(name) {
                Ok(field) if field.data_type() == dt => Expr::Column(Column::from_name(name)),
                Ok(_) => cast(Expr::Column(Column::from_name(name)), dt.clone()),
                Err(_) => lit(ScalarValue::try_from(dt).map_err(query_error)?),
            };
            exprs.push(expr.alias(name));
        }
        let branch = LogicalPlanBuilder::from(plan).project(exprs).and_then(LogicalPlanBuilder::build).map_err(query_error)?;
        builder = Some(match builder {
            None => LogicalPlanBuilder::from(branch),
            Some(b) => b.union(branch).map_err(query_error)?,
        });
    }
    builder.expect("at least one dataset").build().map_err(query_error)
}

/// The columns of a stacked table in a lake with no datasets yet.
fn empty_schema(table: &str) -> SchemaRef {
    let base = match table {
        tables::STEPS => Arc::new(Schema::new(
            [("index", DataType::Int64), ("episode_index", DataType::Int64), ("frame_index", DataType::Int64)]
                .into_iter()
                .map(|(n, t)| Field::new(n, t, false))
                .chain([Field::new("timestamp", DataType::Float32, false), Field::new(tables::TASK, DataType::Utf8, false)])
                .collect::<Vec<_>>(),
        )),
        tables::EPISODES => tables::episodes_schema(),
        tables::TASKS => tables::tasks_schema(),
        tables::STATS => tables::stats_schema(),
        tables::FEATURE_STATS | tables::IMAGE_STATS => tables::feature_stats_schema(),
        tables::FINDINGS => tables::findings_schema(),
        tables::STREAMS => tables::streams_schema(),
        _ => tables::packets_schema(),
    };
    let fields = std::iter::once(Arc::new(Field::new("dataset", DataType::Utf8, false))).chain(base.fields().iter().cloned());
    Arc::new(Schema::new(fields.collect::<Vec<_>>()))
}

fn mem_table(batch: RecordBatch) -> Result<MemTable> {
    MemTable::try_new(batch.schema(), vec![vec![batch]]).map_err(query_error)
}

fn timestamps(values: impl Iterator<Item = i64>) -> TimestampMicrosecondArray {
    TimestampMicrosecondArray::from_iter_values(values).with_timezone("UTC")
}

/// The `datasets` table.
fn datasets_batch(datasets: &[CommitRecord]) -> RecordBatch {
    let utc = Some("UTC".into());
    let schema = Arc::new(Schema::new(vec![
        Field::new("dataset", DataType::Utf8, false),
        Field::new("version", DataType::UInt64, false),
        Field::new("committed_at", DataType::Timestamp(TimeUnit::Microsecond, utc), false),
        Field::new("codebase_version", DataType::Utf8, false),
        Field::new("robot_type", DataType::Utf8, true),
        Field::new("fps", DataType::UInt64, false),
        Field::new("episodes", DataType::UInt64, false),
        Field::new("steps", DataType::UInt64, false),
        Field::new("cameras", DataType::UInt64, false),
        Field::new("packets", DataType::UInt64, false),
        Field::new("tasks", DataType::UInt64, false),
        Field::new("skipped_episodes", DataType::UInt64, false),
        Field::new("source", DataType::Utf8, false),
        Field::new("content_hash", DataType::Utf8, false),
        Field::new("source_bytes", DataType::UInt64, false),
        Field::new("ingest_seconds", DataType::Float64, false),
    ]));
    let u = |f: fn(&CommitRecord) -> u64| Arc::new(UInt64Array::from_iter_values(datasets.iter().map(f))) as ArrayRef;
    let s = |f: fn(&CommitRecord) -> Option<&str>| Arc::new(datasets.iter().map(f).collect::<StringArray>()) as ArrayRef;
    let columns = vec![
        s(|d| Some(&d.name)),
        u(|d| d.version),
        Arc::new(timestamps(datasets.iter().map(|d| d.committed_at.timestamp_micros()))) as ArrayRef,
        s(|d| Some(&d.source.codebase_version)),
        s(|d| d.robot_type.as_deref()),
        u(|d| u64::from(d.fps)),
        u(|d| d.counts.episodes),
        u(|d| d.counts.steps),
        u(|d| d.counts.cameras),
        u(|d| d.counts.packets),
        u(|d| d.counts.tasks),
        u(|d| d.counts.skipped_episodes),
        s(|d| Some(&d.source.url)),
        s(|d| Some(&d.source.content_hash)),
        u(|d| d.source.bytes),
        Arc::new(Float64Array::from_iter_values(datasets.iter().map(|d| d.ingest_seconds))),
    ];
    RecordBatch::try_new(schema, columns).expect("datasets columns match their schema")
}

/// The `views` table: one row per (view's current version, dataset it selects from).
fn views_batch(views: &[ViewRecord]) -> RecordBatch {
    let utc = Some("UTC".into());
    let schema = Arc::new(Schema::new(vec![
        Field::new("view", DataType::Utf8, false),
        Field::new("view_version", DataType::UInt64, false),
        Field::new("dataset", DataType::Utf8, false),
        Field::new("version", DataType::UInt64, false),
        Field::new("weight", DataType::Float64, false),
        Field::new("episodes", DataType::Int64, false),
        Field::new("created_at", DataType::Timestamp(TimeUnit::Microsecond, utc), false),
        Field::new("sql", DataType::Utf8, false),
    ]));
    let rows: Vec<(&ViewRecord, &lake_schemas::ViewDataset)> = views.iter().flat_map(|v| v.datasets.iter().map(move |d| (v, d))).collect();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(rows.iter().map(|(v, _)| Some(v.name.as_str())).collect::<StringArray>()),
        Arc::new(UInt64Array::from_iter_values(rows.iter().map(|(v, _)| v.version))),
        Arc::new(rows.iter().map(|(_, d)| Some(d.name.as_str())).collect::<StringArray>()),
        Arc::new(UInt64Array::from_iter_values(rows.iter().map(|(_, d)| d.version))),
        Arc::new(Float64Array::from_iter_values(rows.iter().map(|(_, d)| d.weight))),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|(_, d)| d.episodes.len() as i64))),
        Arc::new(timestamps(rows.iter().map(|(v, _)| v.created_at.timestamp_micros()))),
        Arc::new(rows.iter().map(|(v, _)| Some(v.sql.as_str())).collect::<StringArray>()),
    ];
    RecordBatch::try_new(schema, columns).expect("views columns match their schema")
}

/// `schema` without field or schema metadata.
fn plain(schema: &Schema) -> SchemaRef {
    Arc::new(Schema::new(schema.fields().iter().map(|f| f.as_ref().clone().with_metadata(Default::default())).collect::<Vec<_>>()))
}

/// A Lance table as SQL sees it: the same scan, with projections, filters and limits pushed into
/// Lance, but without the field metadata lake keeps for the loader (`lake:shape`, `lake:dtype`).
/// The same column of two datasets may differ there (an action of 6 vs 14 values), and DataFusion
/// cannot stack tables whose physical and logical metadata disagree.
#[derive(Debug)]
struct PlainTable {
    inner: Arc<dyn TableProvider>,
    schema: SchemaRef,
    /// Where the table lies, for the error a damaged data file makes.
    uri: String,
}

impl PlainTable {
    fn new(inner: Arc<dyn TableProvider>, uri: String) -> Self {
        let schema = plain(&inner.schema());
        Self { inner, schema, uri }
    }
}

#[async_trait::async_trait]
impl TableProvider for PlainTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        self.inner.table_type()
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        let input = self.inner.scan(state, projection, filters, limit).await?;
        Ok(Arc::new(PlainExec::new(input, self.uri.clone())))
    }

    fn supports_filters_pushdown(&self, filters: &[&Expr]) -> datafusion::error::Result<Vec<TableProviderFilterPushDown>> {
        self.inner.supports_filters_pushdown(filters)
    }
}

/// A table spanning every dataset while one of them cannot be read
/// ([`LakeSql::whole_answers_only`]): planning a scan of it fails with why.
#[derive(Debug)]
struct Incomplete {
    schema: SchemaRef,
    why: String,
}

#[async_trait::async_trait]
impl TableProvider for Incomplete {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::View
    }

    async fn scan(
        &self,
        _: &dyn Session,
        _: Option<&Vec<usize>>,
        _: &[Expr],
        _: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        Err(datafusion::error::DataFusionError::External(self.why.clone().into()))
    }
}

/// Passes its input's batches (a scan of the Lance table at `uri`) on under the input's schema
/// without metadata; a panic of Lance's decoders (a data file damaged in place) ends them with
/// an error saying so.
#[derive(Debug)]
struct PlainExec {
    input: Arc<dyn ExecutionPlan>,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    uri: String,
}

impl PlainExec {
    fn new(input: Arc<dyn ExecutionPlan>, uri: String) -> Self {
        let schema = plain(&input.schema());
        let properties = PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            input.output_partitioning().clone(),
            input.pipeline_behavior(),
            input.boundedness(),
        );
        Self { input, schema, properties: Arc::new(properties), uri }
    }
}

impl DisplayAs for PlainExec {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "PlainExec")
    }
}

impl ExecutionPlan for PlainExec {
    fn name(&self) -> &str {
        "PlainExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        let [input] = <[_; 1]>::try_from(children)
            .map_err(|c| datafusion::error::DataFusionError::Internal(format!("PlainExec takes one child, got {}", c.len())))?;
        Ok(Arc::new(Self::new(input, self.uri.clone())))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> datafusion::error::Result<SendableRecordBatchStream> {
        let schema = self.schema.clone();
        let batches = lake_store::stream_lance(&self.uri, self.input.execute(partition, context)?).map(move |batch| {
            batch.and_then(|b| {
                // Keep the row count: `count(*)` scans no columns at all.
                let options = RecordBatchOptions::new().with_row_count(Some(b.num_rows()));
                RecordBatch::try_new_with_options(schema.clone(), b.columns().to_vec(), &options).map_err(Into::into)
            })
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(self.schema.clone(), batches)))
    }

    fn partition_statistics(&self, partition: Option<usize>) -> datafusion::error::Result<Arc<Statistics>> {
        self.input.partition_statistics(partition)
    }
}

/// `batch` with nested columns (vectors, structs) as their text form (`[1.0, 2.0]`), which CSV
/// cannot hold otherwise; empty for nulls.
///
/// # Errors
/// When a nested column has no text form.
pub fn flat_for_csv(batch: &RecordBatch) -> std::result::Result<RecordBatch, arrow::error::ArrowError> {
    if !batch.schema().fields().iter().any(|f| f.data_type().is_nested()) {
        return Ok(batch.clone());
    }
    let options = arrow::util::display::FormatOptions::default().with_null("");
    let mut fields = Vec::new();
    let mut columns = Vec::new();
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        if field.data_type().is_nested() {
            let formatter = arrow::util::display::ArrayFormatter::try_new(column.as_ref(), &options)?;
            let text: StringArray = (0..column.len()).map(|i| (!column.is_null(i)).then(|| formatter.value(i).to_string())).collect();
            fields.push(Field::new(field.name(), DataType::Utf8, true));
            columns.push(Arc::new(text) as ArrayRef);
        } else {
            fields.push(field.as_ref().clone());
            columns.push(column.clone());
        }
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
}

/// When a query run apart ([`LakeSql::stream_apart`]) is to stop: its deadline, or its answer
/// dropped (a client that went away).
#[derive(Debug)]
struct Stop {
    deadline: std::time::Instant,
    dropped: std::sync::atomic::AtomicBool,
    limit: std::time::Duration,
}

impl Stop {
    fn why(&self) -> Option<String> {
        if self.dropped.load(std::sync::atomic::Ordering::Relaxed) {
            Some("the query's answer was dropped".into())
        } else if std::time::Instant::now() >= self.deadline {
            Some(format!("the query ran past the server's SQL timeout of {} s (`lake serve --sql-timeout`)", self.limit.as_secs()))
        } else {
            None
        }
    }
}

/// `stream`, ended by a panic inside the engine (which DataFusion passes on from its tasks to
/// the stream's reader) with the error [`engine_panic`] makes of it, instead of unwinding
/// through the reader: the query fails, and the process or server goes on.
fn unwinding(stream: SendableRecordBatchStream) -> SendableRecordBatchStream {
    let schema = stream.schema();
    let mut inner = Some(stream);
    let guarded = futures::stream::poll_fn(move |cx| {
        let Some(stream) = inner.as_mut() else { return std::task::Poll::Ready(None) };
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| stream.poll_next_unpin(cx))) {
            Ok(next) => next,
            Err(panic) => {
                inner = None;
                std::task::Poll::Ready(Some(Err(engine_panic(panic.as_ref()))))
            }
        }
    });
    Box::pin(RecordBatchStreamAdapter::new(schema, guarded))
}

/// `schema` with values where it has dictionaries (also inside lists, structs and maps). An answer
/// carries values: every reader of one (Arrow IPC over HTTP, Flight SQL, JSON, CSV) takes them,
/// and the server's IPC encoder writes no dictionaries.
fn plain_schema(schema: &SchemaRef) -> SchemaRef {
    fn plain_field(field: &arrow::datatypes::FieldRef) -> arrow::datatypes::FieldRef {
        Arc::new(field.as_ref().clone().with_data_type(plain_type(field.data_type())))
    }
    fn plain_type(data_type: &DataType) -> DataType {
        match data_type {
            DataType::Dictionary(_, values) => plain_type(values),
            DataType::List(item) => DataType::List(plain_field(item)),
            DataType::LargeList(item) => DataType::LargeList(plain_field(item)),
            DataType::FixedSizeList(item, n) => DataType::FixedSizeList(plain_field(item), *n),
            DataType::Struct(fields) => DataType::Struct(fields.iter().map(plain_field).collect()),
            DataType::Map(entries, sorted) => DataType::Map(plain_field(entries), *sorted),
            other => other.clone(),
        }
    }
    Arc::new(Schema::new_with_metadata(schema.fields().iter().map(plain_field).collect::<Vec<_>>(), schema.metadata().clone()))
}

/// `stream` with its dictionaries cast to their values ([`plain_schema`]); a stream without
/// any, as it is.
fn plain_answer(stream: SendableRecordBatchStream) -> SendableRecordBatchStream {
    let schema = plain_schema(&stream.schema());
    if schema == stream.schema() {
        return stream;
    }
    let target = schema.clone();
    let batches = stream.map(move |batch| {
        let batch = batch?;
        let columns = batch
            .columns()
            .iter()
            .zip(target.fields())
            .map(|(column, field)| arrow::compute::cast(column, field.data_type()))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
        Ok(RecordBatch::try_new_with_options(target.clone(), columns, &options)?)
    });
    Box::pin(RecordBatchStreamAdapter::new(schema, batches))
}

/// `work` (parsing, planning or optimising a query), a panic inside the engine turned into the
/// query's error ([`engine_panic`]): the query fails, and the process or server goes on. The
/// engine's planner and constant folding panic on some values a query can name (`date_trunc`
/// of the earliest timestamp, `date_bin` past `i64`).
async fn planning<T>(work: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    use futures::FutureExt;
    std::panic::AssertUnwindSafe(work).catch_unwind().await.unwrap_or_else(|panic| Err(query_error(engine_panic(panic.as_ref()))))
}

/// A query whose planning or execution panicked, as its error: an array past Arrow's
/// 2 GiB of offsets (a huge value repeated over a batch) as resources exhausted, anything else
/// with the engine's words.
fn engine_panic(payload: &(dyn std::any::Any + Send)) -> datafusion::error::DataFusionError {
    use datafusion::error::DataFusionError;
    let words = payload.downcast_ref::<&str>().copied().or_else(|| payload.downcast_ref::<String>().map(String::as_str)).unwrap_or("");
    if words.contains("offset overflow") {
        return DataFusionError::ResourcesExhausted(
            "a column of the answer would hold over 2 GiB of values in one batch (Arrow's offset overflow)".into(),
        );
    }
    DataFusionError::Execution(format!("the query engine stopped: {words}"))
}

/// Sets [`Stop::dropped`] when the answer it is part of is dropped.
struct DropStops(Arc<Stop>);

impl Drop for DropStops {
    fn drop(&mut self) {
        self.0.dropped.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// An operator of a query run apart, watched: every batch it hands on first checks [`Stop`],
/// and once the query is to stop its stream ends with that error. With every operator of a plan
/// watched, a query stops within one batch of any operator, also inside a join that makes batch
/// after batch from one input batch without ever yielding to its runtime. It stands in for the
/// operator it watches, not above it: its children are the operator's, and it shows as the
/// operator (in `EXPLAIN ANALYZE`, with its metrics).
#[derive(Debug)]
struct StoppableExec {
    input: Arc<dyn ExecutionPlan>,
    stop: Arc<Stop>,
}

impl StoppableExec {
    /// `plan` with every operator watched.
    fn watch(plan: Arc<dyn ExecutionPlan>, stop: &Arc<Stop>) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        use datafusion::common::tree_node::{Transformed, TreeNode};
        plan.transform_up(|node| Ok(Transformed::yes(Arc::new(Self { input: node, stop: stop.clone() }) as Arc<dyn ExecutionPlan>)))
            .map(|t| t.data)
    }
}

impl DisplayAs for StoppableExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        self.input.fmt_as(t, f)
    }
}

impl ExecutionPlan for StoppableExec {
    fn name(&self) -> &str {
        self.input.name()
    }

    fn downcast_delegate(&self) -> Option<&dyn ExecutionPlan> {
        Some(self.input.as_ref())
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        self.input.children()
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Self { input: self.input.clone().with_new_children(children)?, stop: self.stop.clone() }))
    }

    fn metrics(&self) -> Option<datafusion::physical_plan::metrics::MetricsSet> {
        self.input.metrics()
    }

    /// The state a recursive query hands the operator that reads its work table, given to the
    /// operator watched (which is that one, or not).
    fn with_new_state(&self, state: Arc<dyn std::any::Any + Send + Sync>) -> Option<Arc<dyn ExecutionPlan>> {
        Some(Arc::new(Self { input: self.input.with_new_state(state)?, stop: self.stop.clone() }))
    }

    /// The operator watched, reset (a recursive query runs its recursive term again per round).
    fn reset_state(self: Arc<Self>) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Self { input: self.input.clone().reset_state()?, stop: self.stop.clone() }))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> datafusion::error::Result<SendableRecordBatchStream> {
        let stop = self.stop.clone();
        let batches = self.input.execute(partition, context)?.scan(false, move |stopped, batch| {
            let next = match stop.why() {
                _ if *stopped => None,
                Some(why) => {
                    *stopped = true;
                    Some(Err(datafusion::error::DataFusionError::Execution(why)))
                }
                None => Some(batch),
            };
            futures::future::ready(next)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(self.input.schema(), batches)))
    }
}

impl LakeSql {
    /// The answer to `query`, every operator of its plan watched by `stop` ([`StoppableExec`]).
    async fn stream_stoppable(&self, query: &str, stop: &Arc<Stop>) -> Result<SendableRecordBatchStream> {
        let frame = self.plan(query).await?;
        let context = Arc::new(frame.task_ctx());
        let plan = planning(async { frame.create_physical_plan().await.map_err(query_error) }).await?;
        let plan = StoppableExec::watch(plan, stop).map_err(query_error)?;
        Ok(unwinding(plain_answer(datafusion::physical_plan::execute_stream(plan, context).map_err(query_error)?)))
    }

    /// [`LakeSql::stream`] on a thread of its own, ended with an error at `deadline`. A query
    /// computes on the CPU without yielding for long stretches: on the server's runtime it
    /// would hold up every request there, and no timer could stop it. Here the server goes on
    /// serving, the answer ends at the deadline, and the query stops within a batch once its
    /// answer is dropped (a client that goes away) or the deadline passes, also while nobody
    /// reads it. An answer ends only with the query's own end: a thread that stops otherwise
    /// (a panic) ends it with an error, never as if it were complete. `hold` is kept until the
    /// thread ends.
    ///
    /// # Errors
    /// As [`LakeSql::stream`]; [`Error::Query`] when planning runs past the deadline.
    pub async fn stream_apart<H: Send + 'static>(
        self,
        query: String,
        deadline: tokio::time::Instant,
        limit: std::time::Duration,
        hold: H,
    ) -> Result<SendableRecordBatchStream> {
        use datafusion::error::DataFusionError;
        let timeout = move || format!("the query ran past the server's SQL timeout of {} s (`lake serve --sql-timeout`)", limit.as_secs());
        let stop = Arc::new(Stop {
            deadline: std::time::Instant::now() + deadline.saturating_duration_since(tokio::time::Instant::now()),
            dropped: false.into(),
            limit,
        });
        let stops = DropStops(stop.clone());
        let (first_tx, first_rx) = tokio::sync::oneshot::channel::<Result<SchemaRef>>();
        // `None` is the end of the answer; a channel closed without it is a query that stopped.
        let (tx, rx) = tokio::sync::mpsc::channel::<Option<datafusion::error::Result<RecordBatch>>>(1);
        std::thread::Builder::new()
            .name("lake-sql".into())
            .stack_size(limits::STACK_BYTES)
            .spawn(move || {
                // The engine's panics here become the query's error ([`planning`], [`unwinding`]).
                lake_store::log_panics_on_this_thread();
                // Held (a server's SQL slot) for as long as the query runs: until its answer
                // ends, before the end reaches the client (which may then ask again at once).
                let mut hold = Some(hold);
                let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = first_tx.send(Err(Error::Internal(format!("cannot start a runtime for the query: {e}"))));
                        return;
                    }
                };
                // Every operator checks `stop` before it hands a batch on; dropping the stream
                // stops DataFusion's tasks at their next yield.
                runtime.block_on(async move {
                    let mut first_tx = first_tx;
                    let planned = tokio::select! {
                        planned = self.stream_stoppable(&query, &stop) => planned,
                        () = first_tx.closed() => return,
                        () = tokio::time::sleep_until(deadline) => return,
                    };
                    let mut stream = match planned {
                        Ok(stream) => stream,
                        Err(e) => {
                            let _ = first_tx.send(Err(e));
                            return;
                        }
                    };
                    if first_tx.send(Ok(stream.schema())).is_err() {
                        return;
                    }
                    loop {
                        let item = tokio::select! {
                            item = stream.next() => item,
                            () = tx.closed() => return,
                            () = tokio::time::sleep_until(deadline) => return,
                        };
                        // The end, or an error (which ends the answer too).
                        let end = !matches!(item, Some(Ok(_)));
                        if end {
                            drop(hold.take());
                        }
                        match tokio::time::timeout_at(deadline, tx.send(item)).await {
                            Ok(Ok(())) if !end => {}
                            _ => return,
                        }
                    }
                });
            })
            .map_err(|e| Error::Internal(format!("cannot start a thread for the query: {e}")))?;
        let schema = match tokio::time::timeout_at(deadline, first_rx).await {
            Err(_) => return Err(Error::Query(timeout())),
            Ok(Err(_)) if tokio::time::Instant::now() >= deadline => return Err(Error::Query(timeout())),
            Ok(Err(_)) => return Err(Error::Internal("the query's thread ended without an answer".into())),
            Ok(Ok(schema)) => schema?,
        };
        // The answer dropped (a client that went away) stops the query at once.
        let batches = futures::stream::unfold(Some((rx, stops)), move |state| async move {
            let (mut rx, stops) = state?;
            let stopped = |why: String| Some((Err(DataFusionError::Execution(why)), None));
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(Some(item))) => Some((item, Some((rx, stops)))),
                Ok(Some(None)) => None,
                Ok(None) if tokio::time::Instant::now() >= deadline => stopped(timeout()),
                Ok(None) => stopped("the query stopped before its end (the server log says why)".into()),
                Err(_) => stopped(timeout()),
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, batches)))
    }
}
