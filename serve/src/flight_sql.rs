//! Flight SQL over the lake: the same read-only DataFusion session as `lake sql` and
//! `POST /v1/sql`, for ADBC, JDBC and other Flight SQL clients.
//!
//! Statements and prepared statements carry their SQL text as the handle, so any server over
//! the same lake can answer any ticket. Each call opens the lake's current state. The catalog
//! calls (`GetCatalogs`, `GetDbSchemas`, `GetTables`, `GetTableTypes`) list the session's
//! catalog `lake`, its schema `public` of stacked tables and one schema per dataset.

use std::sync::Arc;

use arrow::{array::RecordBatch, datatypes::SchemaRef, ipc::writer::IpcWriteOptions};
use arrow_flight::{
    Action, FlightDescriptor, FlightEndpoint, FlightInfo, IpcMessage, SchemaAsIpc, Ticket,
    encode::FlightDataEncoderBuilder,
    error::FlightError,
    flight_service_server::FlightService,
    sql::{
        ActionClosePreparedStatementRequest, ActionCreatePreparedStatementRequest, ActionCreatePreparedStatementResult, Any,
        CommandGetCatalogs, CommandGetDbSchemas, CommandGetSqlInfo, CommandGetTableTypes, CommandGetTables, CommandPreparedStatementQuery,
        CommandStatementQuery, ProstMessageExt, SqlInfo, TicketStatementQuery,
        metadata::{GetCatalogsBuilder, GetDbSchemasBuilder, GetTablesBuilder, SqlInfoData, SqlInfoDataBuilder},
        server::FlightSqlService,
    },
};
use futures::{StreamExt, TryStreamExt};
use prost::Message;
use tonic::{Request, Response, Status};

use super::{Service, grpc_status as status};
use lake_query::sql::{CATALOG, LakeSql};

use crate::Error;

/// The type URLs of Flight SQL's messages start with this.
const FLIGHT_SQL_TYPE: &str = "type.googleapis.com/arrow.flight.protocol.sql.";

/// Table types of the session: tables over Lance scans are views, the in-memory listings
/// (`datasets`, `views`) are tables; both are read-only.
const TABLE_TYPES: [&str; 2] = ["TABLE", "VIEW"];

/// Whether a descriptor command or ticket is a Flight SQL message (rather than a JSON sampling
/// request).
pub fn is_flight_sql(bytes: &[u8]) -> bool {
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{') {
        return false;
    }
    Any::decode(bytes).is_ok_and(|any| any.type_url.starts_with(FLIGHT_SQL_TYPE))
}

/// The type of a protobuf `Any` message that is not Flight SQL's (`type.googleapis.com/…`), when
/// the bytes are one rather than text.
pub fn other_message(bytes: &[u8]) -> Option<String> {
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{') {
        return None;
    }
    let any = Any::decode(bytes).ok()?;
    let typed = any.type_url.contains('/') && any.type_url.chars().all(|c| c.is_ascii_graphic());
    (typed && !any.type_url.starts_with(FLIGHT_SQL_TYPE)).then_some(any.type_url)
}

/// The name of a Flight SQL command (`CommandGetXdbcTypeInfo`), for messages.
pub fn command_name(bytes: &[u8]) -> String {
    Any::decode(bytes).map_or_else(|_| "command".into(), |any| any.type_url.rsplit(['.', '/']).next().unwrap_or("command").to_string())
}

/// A Flight SQL command lake does not answer says so in its own words (the library's names its
/// internal method).
pub fn unanswered(status: Status, command: &str) -> Status {
    if status.code() != tonic::Code::Unimplemented {
        return status;
    }
    Status::unimplemented(format!(
        "lake's Flight SQL does not answer {command}; it answers statement queries, prepared statements, and the catalogs, \
         schemas, tables, table types and SqlInfo"
    ))
}

/// Refuses a Flight SQL command or ticket (an `Any` with a Flight SQL type) whose message does
/// not decode, or an action body that is not the action's request: `INVALID_ARGUMENT` naming
/// what failed, rather than the library's `INTERNAL` with its debug text.
///
/// # Errors
/// The status, when the bytes do not decode.
pub fn check_message(bytes: &[u8], action: Option<&str>) -> Result<(), Status> {
    fn unpacks<M: ProstMessageExt + Default>(bytes: &[u8]) -> Result<(), String> {
        let any = Any::decode(bytes).map_err(|e| e.to_string())?;
        match any.unpack::<M>() {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(format!("it holds a {}", if any.type_url.is_empty() { "message of no type" } else { &any.type_url })),
            Err(e) => Err(e.to_string()),
        }
    }
    let decoded = match action {
        Some("CreatePreparedStatement") => unpacks::<ActionCreatePreparedStatementRequest>(bytes),
        Some("ClosePreparedStatement") => unpacks::<ActionClosePreparedStatementRequest>(bytes),
        Some(_) => Ok(()),
        None => Any::decode(bytes)
            .map_err(|e| e.to_string())
            .and_then(|any| arrow_flight::sql::Command::try_from(any).map_err(|e| e.to_string()).map(|_| ())),
    };
    decoded.map_err(|why| {
        let what = action.map_or_else(|| "Flight SQL command".to_string(), |a| format!("body of the {a} action"));
        Status::invalid_argument(format!("the {what} cannot be decoded: {why}"))
    })
}

/// Flight SQL over a [`Service`]'s lake. Authentication is checked by the Flight service that
/// dispatches to it.
#[derive(Clone)]
pub struct LakeFlightSql {
    service: Arc<Service>,
    info: Arc<SqlInfoData>,
}

impl std::fmt::Debug for LakeFlightSql {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LakeFlightSql").field("service", &self.service).finish_non_exhaustive()
    }
}

impl LakeFlightSql {
    /// Flight SQL over `service`'s lake.
    pub fn new(service: Arc<Service>) -> Self {
        let mut info = SqlInfoDataBuilder::new();
        info.append(SqlInfo::FlightSqlServerName, "lake");
        info.append(SqlInfo::FlightSqlServerVersion, env!("CARGO_PKG_VERSION"));
        info.append(SqlInfo::FlightSqlServerArrowVersion, arrow::ARROW_VERSION);
        info.append(SqlInfo::FlightSqlServerReadOnly, true);
        info.append(SqlInfo::FlightSqlServerSql, true);
        info.append(SqlInfo::FlightSqlServerSubstrait, false);
        info.append(SqlInfo::FlightSqlServerTransaction, 0i32);
        info.append(SqlInfo::FlightSqlServerCancel, false);
        info.append(SqlInfo::SqlDdlCatalog, false);
        info.append(SqlInfo::SqlDdlSchema, false);
        info.append(SqlInfo::SqlDdlTable, false);
        info.append(SqlInfo::SqlIdentifierQuoteChar, "\"");
        info.append(SqlInfo::SqlTransactionsSupported, false);
        let info = info.build().expect("the SQL info values have the types Flight SQL defines");
        Self { service, info: Arc::new(info) }
    }

    async fn session(&self) -> Result<LakeSql, Status> {
        self.service.sql_session().await.map_err(|e| status(&e))
    }

    /// A failed query's status, counted (as a SQL error, or an internal one when the lake's
    /// files could not be read; a dataset removed meanwhile is not found).
    async fn failed(&self, e: Error) -> Status {
        let e = self.service.explained(e).await;
        self.service.count_sql_error(&e);
        status(&e)
    }

    /// A flight for `query`: its result schema, and one endpoint whose ticket is `ticket`.
    async fn statement_info(&self, query: &str, ticket: Vec<u8>, descriptor: FlightDescriptor) -> Result<FlightInfo, Status> {
        let schema = match self.session().await?.schema_apart(query.to_string()).await {
            Ok(schema) => schema,
            Err(e) => return Err(self.failed(e).await),
        };
        info(&schema, ticket, descriptor)
    }

    /// Runs `query` and streams its result.
    async fn run(&self, query: &str) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let slot = match self.service.sql_slot() {
            Ok(slot) => slot,
            Err(e) => return Err(self.failed(e).await),
        };
        let session = self.session().await?;
        let stream = match self.service.sql_stream(session, query, slot).await {
            Ok(stream) => stream,
            Err(e) => return Err(self.failed(e).await),
        };
        let schema = stream.schema();
        let service = self.service.clone();
        let batches = stream.map_err(move |e| {
            let e = lake_query::sql::sql_error(&e);
            service.count_sql_error(&e);
            FlightError::Tonic(Box::new(status(&e)))
        });
        Ok(encode(schema, batches))
    }

    /// The table listing of the current lake, filtered by `builder`.
    async fn tables(&self, mut builder: GetTablesBuilder) -> Result<RecordBatch, Status> {
        for table in self.session().await?.tables().await.map_err(|e| status(&e))? {
            let kind = if matches!(table.name.as_str(), "datasets" | "views") { "TABLE" } else { "VIEW" };
            builder.append(CATALOG, &table.schema, &table.name, kind, &table.columns).map_err(internal)?;
        }
        builder.build().map_err(filter_refused)
    }

    async fn schema_names(&self) -> Result<Vec<String>, Status> {
        let session = self.session().await?;
        let catalog = session.context().catalog(CATALOG).expect("the lake catalog exists");
        Ok(catalog.schema_names())
    }
}

fn utf8(bytes: &[u8], what: &str) -> Result<String, Status> {
    String::from_utf8(bytes.to_vec()).map_err(|_| Status::invalid_argument(format!("the {what} is not UTF-8 SQL text")))
}

/// A listing's error: a filter pattern Arrow cannot take (one whose regular expression is
/// past the size the regex crate builds) is the request's fault; anything else is internal.
fn filter_refused(e: arrow_flight::error::FlightError) -> Status {
    use arrow_flight::error::FlightError;
    match e {
        FlightError::Arrow(arrow::error::ArrowError::InvalidArgumentError(why)) => {
            Status::invalid_argument(crate::status_message(format!("the filter pattern: {why}")))
        }
        e => internal(e),
    }
}

fn internal(e: impl std::fmt::Display) -> Status {
    tracing::error!("flight sql: {e}");
    Status::internal("internal error; the server log has the details")
}

fn info(schema: &SchemaRef, ticket: Vec<u8>, descriptor: FlightDescriptor) -> Result<FlightInfo, Status> {
    Ok(FlightInfo::new()
        .try_with_schema(schema)
        .map_err(internal)?
        .with_endpoint(FlightEndpoint::new().with_ticket(Ticket::new(ticket)))
        .with_descriptor(descriptor))
}

fn encode(
    schema: SchemaRef,
    batches: impl futures::Stream<Item = Result<RecordBatch, FlightError>> + Send + 'static,
) -> Response<<LakeFlightSql as FlightService>::DoGetStream> {
    let data = FlightDataEncoderBuilder::new().with_schema(schema).build(batches).map_err(|e| match e {
        FlightError::Tonic(s) => *s,
        other => internal(other),
    });
    Response::new(data.boxed())
}

/// The flight of a catalog call: its fixed schema, and the command itself as the ticket.
fn listing(schema: SchemaRef, query: &impl ProstMessageExt, request: Request<FlightDescriptor>) -> Result<Response<FlightInfo>, Status> {
    Ok(Response::new(info(&schema, ticket_of(query), request.into_inner())?))
}

fn one_batch(batch: RecordBatch) -> Response<<LakeFlightSql as FlightService>::DoGetStream> {
    encode(batch.schema(), futures::stream::once(async { Ok(batch) }))
}

fn ticket_of(command: &impl ProstMessageExt) -> Vec<u8> {
    command.as_any().encode_to_vec()
}

#[tonic::async_trait]
impl FlightSqlService for LakeFlightSql {
    type FlightService = Self;

    async fn get_flight_info_statement(
        &self,
        query: CommandStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let ticket = ticket_of(&TicketStatementQuery { statement_handle: query.query.clone().into() });
        Ok(Response::new(self.statement_info(&query.query, ticket, request.into_inner()).await?))
    }

    async fn do_get_statement(
        &self,
        ticket: TicketStatementQuery,
        _: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        self.run(&utf8(&ticket.statement_handle, "statement handle")?).await
    }

    async fn get_flight_info_prepared_statement(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let sql = utf8(&query.prepared_statement_handle, "prepared statement handle")?;
        Ok(Response::new(self.statement_info(&sql, ticket_of(&query), request.into_inner()).await?))
    }

    async fn do_get_prepared_statement(
        &self,
        query: CommandPreparedStatementQuery,
        _: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        self.run(&utf8(&query.prepared_statement_handle, "prepared statement handle")?).await
    }

    /// Plans the statement (refusing it at once when it is not valid) and hands its SQL back as
    /// the handle; statements take no parameters.
    async fn do_action_create_prepared_statement(
        &self,
        query: ActionCreatePreparedStatementRequest,
        _: Request<Action>,
    ) -> Result<ActionCreatePreparedStatementResult, Status> {
        let schema = match self.session().await?.schema_apart(query.query.clone()).await {
            Ok(schema) => schema,
            Err(e) => return Err(self.failed(e).await),
        };
        let IpcMessage(dataset_schema) = SchemaAsIpc::new(&schema, &IpcWriteOptions::default()).try_into().map_err(internal)?;
        Ok(ActionCreatePreparedStatementResult {
            prepared_statement_handle: query.query.into(),
            dataset_schema,
            parameter_schema: Default::default(),
        })
    }

    /// Handles hold no server state: closing is always fine.
    async fn do_action_close_prepared_statement(&self, _: ActionClosePreparedStatementRequest, _: Request<Action>) -> Result<(), Status> {
        Ok(())
    }

    /// An action type the server does not know is a call it does not offer (UNIMPLEMENTED, as
    /// for the Flight SQL actions it knows but does not serve), not a malformed request.
    async fn do_action_fallback(&self, request: Request<Action>) -> Result<Response<<Self as FlightService>::DoActionStream>, Status> {
        let action = &request.get_ref().r#type;
        Err(Status::unimplemented(crate::status_message(format!("action `{action}` is not offered (ListActions names those that are)"))))
    }

    async fn get_flight_info_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        listing(query.into_builder().schema(), &query, request)
    }

    async fn do_get_catalogs(
        &self,
        query: CommandGetCatalogs,
        _: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let mut builder: GetCatalogsBuilder = query.into_builder();
        builder.append(CATALOG);
        Ok(one_batch(builder.build().map_err(internal)?))
    }

    async fn get_flight_info_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        listing(query.clone().into_builder().schema(), &query, request)
    }

    async fn do_get_schemas(
        &self,
        query: CommandGetDbSchemas,
        _: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let mut builder: GetDbSchemasBuilder = query.into_builder();
        let mut names = self.schema_names().await?;
        names.sort();
        for name in names {
            builder.append(CATALOG, name);
        }
        Ok(one_batch(builder.build().map_err(filter_refused)?))
    }

    async fn get_flight_info_tables(
        &self,
        query: CommandGetTables,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        listing(query.clone().into_builder().schema(), &query, request)
    }

    async fn do_get_tables(
        &self,
        query: CommandGetTables,
        _: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        Ok(one_batch(self.tables(query.into_builder()).await?))
    }

    async fn get_flight_info_table_types(
        &self,
        query: CommandGetTableTypes,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        listing(query.into_builder().schema(), &query, request)
    }

    async fn do_get_table_types(
        &self,
        query: CommandGetTableTypes,
        _: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let mut builder = query.into_builder();
        for kind in TABLE_TYPES {
            builder.append(kind);
        }
        Ok(one_batch(builder.build().map_err(internal)?))
    }

    async fn get_flight_info_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        listing(query.clone().into_builder(&self.info).schema(), &query, request)
    }

    async fn do_get_sql_info(
        &self,
        query: CommandGetSqlInfo,
        _: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        Ok(one_batch(query.into_builder(&self.info).build().map_err(internal)?))
    }

    async fn register_sql_info(&self, _: i32, _: &SqlInfo) {}
}
