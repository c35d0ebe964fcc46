//! The gRPC binding of A2A v1.0 (feature `grpc`): the `lf.a2a.v1.A2AService` of A2A's proto,
//! with the generated messages and service of the A2A project's `a2a-pb` crate, served by
//! [`A2aServer`](crate::A2aServer) on the same listener as the HTTP bindings (gRPC's paths,
//! `/lf.a2a.v1.A2AService/<Method>`, are HTTP/2 requests that no other route takes).
//!
//! A thin codec over the same handlers as JSON-RPC and HTTP+JSON: a request message is read
//! as its proto-JSON form (the params those bindings send), run through the handlers, and the
//! answer's JSON read back as the response message (`codec`). Errors are statuses with the
//! code A2A assigns and `google.rpc.ErrorInfo` details (`status`). Credentials are the same
//! headers as over HTTP, as metadata (`x-api-key`, `authorization: Bearer ...`); the
//! request's `tenant` field is the tenant hint that the HTTP+JSON binding takes from its path.
//!
//! [`proto`] and [`tonic`] are re-exported so that a caller builds the same messages and a
//! client ([`proto::a2a_service_client::A2aServiceClient`]) with the versions this server
//! speaks.

mod codec;
mod status;

use std::convert::Infallible;

use axum::body::Body;
use axum::http::Request;
use axum::Router;
use futures::stream::{BoxStream, StreamExt};
use tonic::{Response, Status};
use tower::ServiceExt;
use tracing::Instrument;

use crate::handlers::{Handlers, Operation, Reply};
use crate::jsonrpc::{RpcError, INTERNAL_ERROR};
use crate::security::Denied;
use crate::version::{requested_version, v1_only, Version};
use codec::{answer_message, request_json, stream_message};
pub use codec::{from_json, to_json, ProtoJson};
use proto::a2a_service_server::{A2aService, A2aServiceServer, SERVICE_NAME};

/// A2A's generated protobuf messages, service and client (`a2a_pb::proto`).
pub use a2a_pb::proto;
/// The gRPC library the service and client are built with.
pub use tonic;
/// The richer error model of `tonic` (read a status's `ErrorInfo` with `StatusExt`).
pub use tonic_types;

/// A stream of `StreamResponse` messages; an error status ends it.
type ResponseStream = BoxStream<'static, Result<proto::StreamResponse, Status>>;

/// The A2A service over the handlers.
#[derive(Clone)]
struct GrpcBinding {
    handlers: Handlers,
}

/// The routes of the gRPC service, to merge into the server's router. Request messages
/// larger than `body_limit` are refused with RESOURCE_EXHAUSTED, as larger bodies are on the
/// HTTP bindings, and undecodable ones with INVALID_ARGUMENT (see [`status::request_status`]).
pub(crate) fn router(handlers: Handlers, body_limit: usize) -> Router {
    let service = A2aServiceServer::new(GrpcBinding { handlers })
        .max_decoding_message_size(body_limit)
        .map_request(|request: Request<Body>| request.map(tonic::body::Body::new))
        .map_response(status::request_status)
        .map_err(|never: Infallible| match never {});
    Router::new().route_service(&format!("/{SERVICE_NAME}/{{*method}}"), service)
}

fn internal() -> Status {
    status::status(&RpcError::new(INTERNAL_ERROR, "internal error"))
}

impl GrpcBinding {
    /// Authenticate the request and run `operation` through the handlers.
    async fn run<M: ProtoJson>(
        &self,
        operation: Operation,
        request: tonic::Request<M>,
    ) -> Result<Reply, Status> {
        let (metadata, _, message) = request.into_parts();
        let headers = metadata.into_headers();
        // The binding is A2A 1.0 only, as HTTP+JSON is; no version is 0.3 (v1.0.1, 3.6.2).
        match requested_version(&headers, &[]).map_err(|e| status::status(&e))? {
            Some(Version::V1) => {}
            Some(Version::V03) => return Err(status::status(&v1_only("gRPC", true))),
            None => return Err(status::status(&v1_only("gRPC", false))),
        }
        let params = request_json(&message).map_err(|e| status::status(&e))?;
        let tenant = params
            .get("tenant")
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned);
        let auth = match self.handlers.authenticate(&headers, tenant) {
            Ok(auth) => auth,
            Err(Denied::Unauthenticated(reason)) => {
                tracing::debug!(reason, "gRPC request not authenticated");
                return Err(status::unauthenticated(reason));
            }
            Err(Denied::Failed(error)) => return Err(status::status(&error)),
        };
        let span = tracing::info_span!("a2a.request", binding = "grpc", operation = ?operation);
        self.handlers
            .handle(&auth, operation, params)
            .instrument(span)
            .await
            .map_err(|e| status::status(&e))
    }

    /// A unary operation: its answer as the response message `R`.
    async fn unary<M: ProtoJson, R: ProtoJson>(
        &self,
        operation: Operation,
        request: tonic::Request<M>,
    ) -> Result<Response<R>, Status> {
        match self.run(operation, request).await? {
            Reply::Unary(json) => answer_message(json.get())
                .map(Response::new)
                .map_err(|e| status::status(&e)),
            Reply::Stream(_) => Err(internal()),
        }
    }

    /// A streaming operation: each event as a `StreamResponse`; an error ends the stream
    /// with its status.
    async fn stream<M: ProtoJson>(
        &self,
        operation: Operation,
        request: tonic::Request<M>,
    ) -> Result<Response<ResponseStream>, Status> {
        match self.run(operation, request).await? {
            Reply::Stream(events) => Ok(Response::new(
                events
                    .map(|event| {
                        event
                            .and_then(|event| stream_message(&event))
                            .map_err(|e| status::status(&e))
                    })
                    .boxed(),
            )),
            Reply::Unary(_) => Err(internal()),
        }
    }
}

/// The service's methods: each is its operation run by [`GrpcBinding::unary`] or
/// [`GrpcBinding::stream`] (the trait's methods differ only in their names and types).
macro_rules! a2a_service {
    (
        unary { $($method:ident($request:ident) -> $response:ident = $operation:ident;)* }
        streams { $($s_method:ident($s_request:ident) = $s_operation:ident, $stream:ident;)* }
    ) => {
        #[tonic::async_trait]
        impl A2aService for GrpcBinding {
            $(
                async fn $method(
                    &self,
                    request: tonic::Request<proto::$request>,
                ) -> Result<Response<proto::$response>, Status> {
                    self.unary(Operation::$operation, request).await
                }
            )*

            $(
                type $stream = ResponseStream;

                async fn $s_method(
                    &self,
                    request: tonic::Request<proto::$s_request>,
                ) -> Result<Response<ResponseStream>, Status> {
                    self.stream(Operation::$s_operation, request).await
                }
            )*

            async fn delete_task_push_notification_config(
                &self,
                request: tonic::Request<proto::DeleteTaskPushNotificationConfigRequest>,
            ) -> Result<Response<()>, Status> {
                // The answer is `google.protobuf.Empty`: nothing of the handlers' JSON to carry.
                match self.run(Operation::DeletePushConfig, request).await? {
                    Reply::Unary(_) => Ok(Response::new(())),
                    Reply::Stream(_) => Err(internal()),
                }
            }
        }
    };
}

a2a_service! {
    unary {
        send_message(SendMessageRequest) -> SendMessageResponse = SendMessage;
        get_task(GetTaskRequest) -> Task = GetTask;
        list_tasks(ListTasksRequest) -> ListTasksResponse = ListTasks;
        cancel_task(CancelTaskRequest) -> Task = CancelTask;
        create_task_push_notification_config(TaskPushNotificationConfig)
            -> TaskPushNotificationConfig = CreatePushConfig;
        get_task_push_notification_config(GetTaskPushNotificationConfigRequest)
            -> TaskPushNotificationConfig = GetPushConfig;
        list_task_push_notification_configs(ListTaskPushNotificationConfigsRequest)
            -> ListTaskPushNotificationConfigsResponse = ListPushConfigs;
        get_extended_agent_card(GetExtendedAgentCardRequest) -> AgentCard = GetExtendedAgentCard;
    }
    streams {
        send_streaming_message(SendMessageRequest)
            = SendStreamingMessage, SendStreamingMessageStream;
        subscribe_to_task(SubscribeToTaskRequest) = SubscribeToTask, SubscribeToTaskStream;
    }
}
