//! The Arrow Flight service: datasets as flights, sampling requests as descriptors and tickets.

use std::{pin::Pin, sync::Arc};

use arrow::ipc::writer::IpcWriteOptions;
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightEndpoint, FlightInfo, HandshakeRequest, HandshakeResponse,
    PollInfo, PutResult, SchemaAsIpc, SchemaResult, Ticket, encode::FlightDataEncoderBuilder, error::FlightError,
    flight_service_server::FlightService,
};
use futures::{Stream, StreamExt, TryStreamExt};
use tonic::{Request, Response, Status, Streaming};

use super::{
    Footprint, SampleRequest, Service,
    flight_sql::{self, LakeFlightSql, check_message, is_flight_sql},
    grpc_status as status,
};
use crate::Error;

type Boxed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// Flight over a [`Service`].
#[derive(Debug, Clone)]
pub struct LakeFlight {
    service: Arc<Service>,
    sql: LakeFlightSql,
}

impl LakeFlight {
    /// Flight over `service`.
    pub fn new(service: Arc<Service>) -> Self {
        Self { sql: LakeFlightSql::new(service.clone()), service }
    }

    fn check<T>(&self, request: &Request<T>) -> Result<(), Status> {
        self.authorize(super::bearer_token(request.metadata().get("authorization").and_then(|v| v.to_str().ok())))
    }

    /// Refuses a missing or wrong bearer token when the server has tokens.
    pub(super) fn authorize(&self, token: Option<&str>) -> Result<(), Status> {
        if self.service.authorized(token) { Ok(()) } else { Err(Status::unauthenticated("a valid bearer token is required")) }
    }

    /// What a `DoGet` ticket asks for: a sampling request's batches, or a Flight SQL result.
    pub(super) async fn ticket_batches(&self, ticket: Ticket) -> Result<Answer, Status> {
        if is_flight_sql(&ticket.ticket) {
            self.decodes(&ticket.ticket, None)?;
            let command = flight_sql::command_name(&ticket.ticket);
            let answer = self.sql.do_get(Request::new(ticket)).await.map_err(|e| flight_sql::unanswered(e, &command))?;
            return Ok(Answer::Messages(answer.into_inner()));
        }
        if ticket.ticket.is_empty() {
            self.service.count_bad();
            return Err(Status::invalid_argument("the ticket is empty; it must hold a JSON sampling request"));
        }
        let sample = self.service.parse_ticket(&ticket.ticket).map_err(|e| status(&e))?;
        let (schema, batches) = self.service.batches(&sample).await.map_err(|e| status(&e))?;
        Ok(Answer::Batches(schema, batches.map_err(|e| status(&e)).boxed()))
    }
}

/// What a ticket is answered with.
pub enum Answer {
    /// Record batches of this schema (a sampling request).
    Batches(arrow::datatypes::SchemaRef, std::pin::Pin<Box<dyn Stream<Item = Result<lake_loader::SampleBatch, Status>> + Send>>),
    /// Flight messages made elsewhere (Flight SQL).
    Messages(std::pin::Pin<Box<dyn Stream<Item = Result<FlightData, Status>> + Send>>),
}

impl LakeFlight {
    /// Refuses (and counts) a Flight SQL message or action body that does not decode.
    fn decodes(&self, bytes: &[u8], action: Option<&str>) -> Result<(), Status> {
        check_message(bytes, action).inspect_err(|_| self.service.count_bad())
    }

    /// The sampling request in a descriptor's command.
    fn request_of(&self, descriptor: &FlightDescriptor) -> Result<SampleRequest, Status> {
        let bytes = &descriptor.cmd;
        let refused = |message: String| {
            self.service.count_bad();
            Err(Status::invalid_argument(message))
        };
        if descriptor.r#type == arrow_flight::flight_descriptor::DescriptorType::Path as i32 {
            return refused(crate::status_message(format!(
                "lake takes CMD descriptors (a JSON sampling request, or a Flight SQL command), not PATH descriptors ({:?})",
                descriptor.path
            )));
        }
        if bytes.is_empty() {
            return refused("the descriptor's command is empty; it must hold a JSON sampling request".into());
        }
        if let Some(kind) = flight_sql::other_message(bytes) {
            return refused(format!(
                "the descriptor's command is a {kind} message, which lake does not take: it holds a JSON sampling request or a \
                 Flight SQL command"
            ));
        }
        self.service.parse_request(bytes).map_err(|e| status(&e))
    }
}

#[tonic::async_trait]
impl FlightService for LakeFlight {
    type HandshakeStream = Boxed<HandshakeResponse>;
    type ListFlightsStream = Boxed<FlightInfo>;
    type DoGetStream = Boxed<FlightData>;
    type DoPutStream = Boxed<PutResult>;
    type DoExchangeStream = Boxed<FlightData>;
    type DoActionStream = Boxed<arrow_flight::Result>;
    type ListActionsStream = Boxed<ActionType>;

    async fn handshake(&self, _: Request<Streaming<HandshakeRequest>>) -> Result<Response<Self::HandshakeStream>, Status> {
        Err(Status::unimplemented("no handshake: send `authorization: Bearer <token>` with each call"))
    }

    /// One flight per dataset; its descriptor is the command sampling the whole dataset (no
    /// windows), with that command's batch schema. A dataset that cannot be opened is listed
    /// without a schema: its `GetFlightInfo` says why.
    async fn list_flights(&self, request: Request<Criteria>) -> Result<Response<Self::ListFlightsStream>, Status> {
        self.check(&request)?;
        let datasets = self.service.lake().datasets().await.map_err(|e| status(&Error::Store(e)))?;
        let mut infos = Vec::new();
        for d in datasets {
            // One epoch of the dataset, every step once (the last batch short), so that a
            // generic Flight client reading a listed flight to its end gets `total_records` rows.
            let epoch = serde_json::json!({"datasets": [format!("{}@{}", d.name, d.version)], "drop_last": false});
            let plan =
                async { self.service.describe(&self.service.parse_request(epoch.to_string().as_bytes())?, Footprint::ENCODED).await }.await;
            let mut cmd = epoch;
            if let Ok(plan) = &plan {
                cmd["limit_batches"] = plan.steps_per_epoch.into();
            }
            let cmd = cmd.to_string();
            let mut info = FlightInfo::new()
                .with_descriptor(FlightDescriptor::new_cmd(cmd.clone()))
                .with_endpoint(FlightEndpoint::new().with_ticket(Ticket::new(cmd.clone())))
                .with_total_records(d.counts.steps as i64);
            if let Ok(plan) = plan {
                info = info
                    .try_with_schema(&plan.schema)
                    .map_err(|e| Status::internal(e.to_string()))?
                    .with_total_records(plan.epoch_len as i64);
            }
            infos.push(Ok(info));
        }
        Ok(Response::new(futures::stream::iter(infos).boxed()))
    }

    /// The descriptor's request → one endpoint whose ticket is the request itself (any server
    /// over the same lake can serve it).
    async fn get_flight_info(&self, request: Request<FlightDescriptor>) -> Result<Response<FlightInfo>, Status> {
        self.check(&request)?;
        if is_flight_sql(&request.get_ref().cmd) {
            self.decodes(&request.get_ref().cmd, None)?;
            let command = flight_sql::command_name(&request.get_ref().cmd);
            return self.sql.get_flight_info(request).await.map_err(|e| flight_sql::unanswered(e, &command));
        }
        let descriptor = request.into_inner();
        let sample = self.request_of(&descriptor)?;
        let plan = self.service.describe(&sample, Footprint::ENCODED).await.map_err(|e| status(&e))?;
        // The ticket reads the versions planned, whatever is ingested before it is redeemed.
        let pinned = SampleRequest { datasets: plan.datasets.clone(), ..sample };
        let ticket = serde_json::to_vec(&pinned).map_err(|e| Status::internal(e.to_string()))?;
        // Known up front for a limited stream (an endless one leaves it unknown: -1).
        let records = self.service.records(&pinned, plan.epoch_len).and_then(|n| i64::try_from(n).ok()).unwrap_or(-1);
        let info = FlightInfo::new()
            .try_with_schema(&plan.schema)
            .map_err(|e| Status::internal(e.to_string()))?
            .with_endpoint(FlightEndpoint::new().with_ticket(Ticket::new(ticket)))
            .with_descriptor(descriptor)
            .with_total_records(records)
            .with_app_metadata(plan.shape_json());
        Ok(Response::new(info))
    }

    async fn poll_flight_info(&self, _: Request<FlightDescriptor>) -> Result<Response<PollInfo>, Status> {
        Err(Status::unimplemented("use GetFlightInfo: sampling requests are planned at once"))
    }

    async fn get_schema(&self, request: Request<FlightDescriptor>) -> Result<Response<SchemaResult>, Status> {
        self.check(&request)?;
        if is_flight_sql(&request.get_ref().cmd) {
            self.decodes(&request.get_ref().cmd, None)?;
            let command = flight_sql::command_name(&request.get_ref().cmd);
            let info = self.sql.get_flight_info(request).await.map_err(|e| flight_sql::unanswered(e, &command))?.into_inner();
            return Ok(Response::new(SchemaResult { schema: info.schema }));
        }
        let sample = self.request_of(request.get_ref())?;
        let schema = self.service.describe(&sample, Footprint::ENCODED).await.map_err(|e| status(&e))?.schema;
        let result = SchemaAsIpc::new(&schema, &IpcWriteOptions::default())
            .try_into()
            .map_err(|e: arrow::error::ArrowError| Status::internal(e.to_string()))?;
        Ok(Response::new(result))
    }

    /// The ticket's request → its batches, streamed as they are made. `lake serve` answers
    /// `DoGet` on its own route ([`super::do_get`]), without copying batches; this is the same
    /// answer through Arrow's encoder, for hosts that mount only the generated service.
    async fn do_get(&self, request: Request<Ticket>) -> Result<Response<Self::DoGetStream>, Status> {
        self.check(&request)?;
        let (schema, batches) = match self.ticket_batches(request.into_inner()).await? {
            Answer::Messages(messages) => return Ok(Response::new(messages)),
            Answer::Batches(schema, batches) => (schema, batches),
        };
        // One training batch is one Flight message (the encoder would otherwise split it into
        // 2 MB pieces); clients raise their receive limit accordingly.
        let data = FlightDataEncoderBuilder::new()
            .with_max_flight_data_size(usize::MAX)
            .with_schema(schema)
            .build(
                batches
                    .map(|b| b?.to_record_batch().map_err(|e| Status::internal(format!("encoding a batch: {e}"))))
                    .map_err(|s| FlightError::Tonic(Box::new(s))),
            )
            .map_err(|e| match e {
                FlightError::Tonic(s) => *s,
                other => Status::internal(other.to_string()),
            });
        Ok(Response::new(data.boxed()))
    }

    async fn do_put(&self, request: Request<Streaming<FlightData>>) -> Result<Response<Self::DoPutStream>, Status> {
        self.check(&request)?;
        Err(Status::unimplemented("DoPut is not offered: the lake is written by `lake ingest`, and prepared statements take no parameters"))
    }

    async fn do_exchange(&self, request: Request<Streaming<FlightData>>) -> Result<Response<Self::DoExchangeStream>, Status> {
        self.check(&request)?;
        Err(Status::unimplemented("DoExchange is not offered"))
    }

    /// [`SAMPLING_FACTS`](lake_client::SAMPLING_FACTS), and Flight SQL's actions (prepared
    /// statements).
    async fn do_action(&self, request: Request<Action>) -> Result<Response<Self::DoActionStream>, Status> {
        self.check(&request)?;
        let action = request.get_ref();
        if action.r#type == lake_client::SAMPLING_FACTS {
            let sample = self.service.parse_request(&action.body).map_err(|e| status(&e))?;
            let facts = self.service.sampling_facts(&sample).await.map_err(|e| status(&e))?;
            let body = serde_json::to_vec(&facts).map_err(|e| Status::internal(e.to_string()))?;
            return Ok(Response::new(futures::stream::once(async move { Ok(arrow_flight::Result { body: body.into() }) }).boxed()));
        }
        self.decodes(&action.body, Some(action.r#type.as_str()))?;
        self.sql.do_action(request).await
    }

    /// The actions served: a sampling request's facts for a trainer, and Flight SQL's prepared
    /// statements (no transactions, savepoints, Substrait plans or query cancellation).
    async fn list_actions(&self, request: Request<Empty>) -> Result<Response<Self::ListActionsStream>, Status> {
        self.check(&request)?;
        let offered = self.sql.list_actions(request).await?.into_inner().try_filter(|action| {
            futures::future::ready(matches!(action.r#type.as_str(), "CreatePreparedStatement" | "ClosePreparedStatement"))
        });
        let facts = ActionType {
            r#type: lake_client::SAMPLING_FACTS.into(),
            description: "The body is a JSON sampling request; the result, as JSON, what a trainer builds its policy from: fps, the \
                          features as samples carry them, the statistics of the steps sampled, the datasets sampled"
                .into(),
        };
        Ok(Response::new(futures::stream::once(async { Ok(facts) }).chain(offered).boxed()))
    }
}
