//! A thin Toxiproxy-compatible REST server on top of `noxious` (a Rust port of Toxiproxy's core).
//!
//! Usage: `toxiproxy-server [-host 127.0.0.1] [-port 8474]` (port 0 picks a free one). Prints
//! `listening on HOST:PORT` on stdout once the API accepts requests.
//!
//! Each proxy is a public listener of ours (see `front`) piping to a noxious proxy on a private
//! loopback port; noxious applies latency, timeout, slicer, limit_data, slow_close; our front
//! applies `reset_peer` (not in noxious) and `bandwidth` (buggy in noxious 1.0.4).

mod front;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bmrng::RequestSender;
use front::FrontToxic;
use noxious::proxy::{ProxyConfig, ProxyRunner, Runner, Toxics};
use noxious::signal::{Close, Stop, Stopper};
use noxious::socket::TcpListener as NoxiousListener;
use noxious::state::SharedProxyInfo;
use noxious::toxic::{Toxic, ToxicEvent, ToxicEventKind, ToxicEventResult};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::{watch, Mutex};
use tokio::task::JoinHandle;

const VERSION: &str = concat!("2.5.0-reroll-noxious-", env!("CARGO_PKG_VERSION"));

struct Entry {
    name: String,
    listen: SocketAddr,
    upstream: String,
    info: SharedProxyInfo,
    stopper: Stopper,
    close: Close,
    events: RequestSender<ToxicEvent, ToxicEventResult>,
    internal: SocketAddr,
    front_toxics: watch::Sender<Vec<FrontToxic>>,
    front: Option<JoinHandle<()>>,
}

type Store = Arc<Mutex<BTreeMap<String, Entry>>>;

/// An API error: the HTTP status and a message (returned as `{"error": ..., "status": ...}`).
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({"error": self.1, "status": self.0.as_u16()}))).into_response()
    }
}

type ApiResult = Result<Response, ApiError>;

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, msg.into())
}

fn not_found(what: &str) -> ApiError {
    ApiError(StatusCode::NOT_FOUND, format!("{what} not found"))
}

impl Entry {
    fn enabled(&self) -> bool {
        self.front.is_some()
    }

    fn toxics(&self) -> Vec<Value> {
        let mut out: Vec<Value> = self.info.state.lock().toxics.clone().into_vec().iter().map(toxic_json).collect();
        out.extend(self.front_toxics.borrow().iter().map(FrontToxic::to_json));
        out
    }

    fn to_json(&self) -> Value {
        json!({
            "name": self.name, "listen": self.listen.to_string(), "upstream": self.upstream,
            "enabled": self.enabled(), "toxics": self.toxics(),
        })
    }

    async fn enable(&mut self) -> Result<(), ApiError> {
        if self.front.is_none() {
            let listener = TcpListener::bind(self.listen)
                .await
                .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("listen {}: {e}", self.listen)))?;
            self.front = Some(tokio::spawn(front::serve(listener, self.internal, self.front_toxics.subscribe())));
        }
        Ok(())
    }

    fn disable(&mut self) {
        if let Some(task) = self.front.take() {
            task.abort();
        }
    }

    async fn event(&self, kind: ToxicEventKind) -> Result<(), ApiError> {
        match self.events.send_receive(ToxicEvent::new(self.name.clone(), kind)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(bad(format!("toxic update failed: {e}"))),
            Err(_) => Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, "proxy stopped".into())),
        }
    }

    async fn shut(mut self) {
        self.disable();
        self.stopper.stop();
        let _ = self.close.recv().await;
    }
}

/// A noxious toxic in Toxiproxy's JSON shape (`stream`, not noxious's `direction`).
fn toxic_json(toxic: &Toxic) -> Value {
    let mut value = serde_json::to_value(toxic).unwrap_or(Value::Null);
    if let Some(obj) = value.as_object_mut() {
        if let Some(direction) = obj.remove("direction") {
            obj.insert("stream".into(), direction);
        }
    }
    value
}

fn free_loopback_port() -> std::io::Result<SocketAddr> {
    std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()
}

async fn create_entry(body: &Map<String, Value>) -> Result<Entry, ApiError> {
    let field = |key: &str| body.get(key).and_then(Value::as_str).unwrap_or("").to_owned();
    let (name, upstream, listen) = (field("name"), field("upstream"), field("listen"));
    if name.is_empty() || upstream.is_empty() {
        return Err(bad("proxy needs 'name' and 'upstream'"));
    }
    let listen = if listen.is_empty() { "127.0.0.1:0".to_owned() } else { listen };
    let public = TcpListener::bind(&listen).await.map_err(|e| bad(format!("listen {listen}: {e}")))?;
    let internal = free_loopback_port().map_err(|e| bad(format!("internal port: {e}")))?;
    let config = ProxyConfig { name: name.clone(), listen: internal.to_string(), upstream: upstream.clone(), enabled: true, rand_seed: None };
    let (listener, info) = ProxyRunner::initialize_proxy::<NoxiousListener>(config, Toxics::empty())
        .await
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("noxious listen {internal}: {e}")))?;
    let (stop, stopper) = Stop::new();
    let (close, closer) = Close::new();
    let (events, receiver) = bmrng::channel(4);
    tokio::spawn(ProxyRunner::run_proxy(listener, info.clone(), receiver, stop, closer));
    let (front_toxics, _) = watch::channel(Vec::new());
    let listen = public.local_addr().map_err(|e| bad(e.to_string()))?;
    let enabled = body.get("enabled").and_then(Value::as_bool).unwrap_or(true);
    let front = enabled.then(|| tokio::spawn(front::serve(public, internal, front_toxics.subscribe())));
    Ok(Entry { name, listen, upstream, info, stopper, close, events, internal, front_toxics, front })
}

fn object(body: Value) -> Result<Map<String, Value>, ApiError> {
    match body {
        Value::Object(map) => Ok(map),
        _ => Err(bad("body must be a JSON object")),
    }
}

async fn list_proxies(State(store): State<Store>) -> Json<Value> {
    let store = store.lock().await;
    Json(Value::Object(store.iter().map(|(name, e)| (name.clone(), e.to_json())).collect()))
}

async fn create_proxy(State(store): State<Store>, Json(body): Json<Value>) -> ApiResult {
    let body = object(body)?;
    let mut store = store.lock().await;
    let name = body.get("name").and_then(Value::as_str).unwrap_or("");
    if store.contains_key(name) {
        return Err(ApiError(StatusCode::CONFLICT, format!("proxy {name} already exists")));
    }
    let entry = create_entry(&body).await?;
    let out = entry.to_json();
    store.insert(entry.name.clone(), entry);
    Ok((StatusCode::CREATED, Json(out)).into_response())
}

async fn get_proxy(State(store): State<Store>, Path(name): Path<String>) -> ApiResult {
    let store = store.lock().await;
    Ok(Json(store.get(&name).ok_or_else(|| not_found("proxy"))?.to_json()).into_response())
}

async fn update_proxy(State(store): State<Store>, Path(name): Path<String>, Json(body): Json<Value>) -> ApiResult {
    let body = object(body)?;
    let mut store = store.lock().await;
    let entry = store.get_mut(&name).ok_or_else(|| not_found("proxy"))?;
    for key in ["listen", "upstream"] {
        if let Some(value) = body.get(key) {
            let current = if key == "listen" { entry.listen.to_string() } else { entry.upstream.clone() };
            if value.as_str() != Some(current.as_str()) {
                return Err(bad(format!("changing '{key}' is not supported; delete and re-create the proxy")));
            }
        }
    }
    match body.get("enabled").and_then(Value::as_bool) {
        Some(true) => entry.enable().await?,
        Some(false) => entry.disable(),
        None => {}
    }
    Ok(Json(entry.to_json()).into_response())
}

async fn delete_proxy(State(store): State<Store>, Path(name): Path<String>) -> ApiResult {
    let entry = store.lock().await.remove(&name).ok_or_else(|| not_found("proxy"))?;
    entry.shut().await;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn list_toxics(State(store): State<Store>, Path(name): Path<String>) -> ApiResult {
    let store = store.lock().await;
    Ok(Json(store.get(&name).ok_or_else(|| not_found("proxy"))?.toxics()).into_response())
}

fn find_toxic(entry: &Entry, toxic: &str) -> Option<Value> {
    entry.toxics().into_iter().find(|t| t.get("name").and_then(Value::as_str) == Some(toxic))
}

/// Fill Toxiproxy's defaults into a toxic body: stream, name (`TYPE_STREAM`), toxicity, attributes.
fn normalize_toxic(mut body: Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
    let kind = body.get("type").and_then(Value::as_str).ok_or_else(|| bad("toxic needs a 'type'"))?.to_owned();
    if let Some(direction) = body.remove("direction") {
        body.entry("stream").or_insert(direction);
    }
    let stream = body.entry("stream").or_insert_with(|| json!("downstream")).as_str().unwrap_or("").to_owned();
    let name = body.get("name").and_then(Value::as_str).unwrap_or("");
    if name.is_empty() {
        body.insert("name".into(), json!(format!("{kind}_{stream}")));
    }
    body.entry("toxicity").or_insert(json!(1.0));
    body.entry("attributes").or_insert(json!({}));
    Ok(body)
}

enum Parsed {
    Noxious(Toxic),
    Front(FrontToxic),
}

fn parse_toxic(body: Map<String, Value>) -> Result<Parsed, ApiError> {
    if let Some(toxic) = FrontToxic::parse(&body) {
        return Ok(Parsed::Front(toxic));
    }
    serde_json::from_value(Value::Object(body)).map(Parsed::Noxious).map_err(|e| bad(format!("invalid toxic: {e}")))
}

async fn create_toxic(State(store): State<Store>, Path(name): Path<String>, Json(body): Json<Value>) -> ApiResult {
    let body = normalize_toxic(object(body)?)?;
    let mut store = store.lock().await;
    let entry = store.get_mut(&name).ok_or_else(|| not_found("proxy"))?;
    let toxic_name = body["name"].as_str().unwrap_or("").to_owned();
    if find_toxic(entry, &toxic_name).is_some() {
        return Err(ApiError(StatusCode::CONFLICT, format!("toxic {toxic_name} already exists")));
    }
    match parse_toxic(body)? {
        Parsed::Front(toxic) => entry.front_toxics.send_modify(|toxics| toxics.push(toxic)),
        Parsed::Noxious(toxic) => entry.event(ToxicEventKind::AddToxic(toxic)).await?,
    }
    Ok(Json(find_toxic(entry, &toxic_name)).into_response())
}

async fn get_toxic(State(store): State<Store>, Path((name, toxic)): Path<(String, String)>) -> ApiResult {
    let store = store.lock().await;
    let entry = store.get(&name).ok_or_else(|| not_found("proxy"))?;
    Ok(Json(find_toxic(entry, &toxic).ok_or_else(|| not_found("toxic"))?).into_response())
}

async fn update_toxic(
    State(store): State<Store>,
    Path((name, toxic)): Path<(String, String)>,
    Json(body): Json<Value>,
) -> ApiResult {
    let patch = object(body)?;
    let mut store = store.lock().await;
    let entry = store.get_mut(&name).ok_or_else(|| not_found("proxy"))?;
    let mut merged = object(find_toxic(entry, &toxic).ok_or_else(|| not_found("toxic"))?)?;
    for (key, value) in patch {
        match (merged.get_mut(&key), value) {
            (Some(Value::Object(old)), Value::Object(new)) if key == "attributes" => old.extend(new),
            (_, value) if key == "name" || key == "type" || key == "stream" => {
                if merged.get(&key) != Some(&value) {
                    return Err(bad(format!("changing a toxic's '{key}' is not supported")));
                }
            }
            (_, value) => {
                merged.insert(key, value);
            }
        }
    }
    match parse_toxic(merged)? {
        Parsed::Front(new) => entry.front_toxics.send_modify(|toxics| {
            toxics.iter_mut().filter(|t| t.name == new.name).for_each(|t| *t = new.clone());
        }),
        Parsed::Noxious(toxic) => entry.event(ToxicEventKind::UpdateToxic(toxic)).await?,
    }
    Ok(Json(find_toxic(entry, &toxic)).into_response())
}

async fn delete_toxic(State(store): State<Store>, Path((name, toxic)): Path<(String, String)>) -> ApiResult {
    let mut store = store.lock().await;
    let entry = store.get_mut(&name).ok_or_else(|| not_found("proxy"))?;
    let in_front = entry.front_toxics.borrow().iter().any(|t| t.name == toxic);
    if in_front {
        entry.front_toxics.send_modify(|toxics| toxics.retain(|t| t.name != toxic));
    } else if find_toxic(entry, &toxic).is_some() {
        entry.event(ToxicEventKind::RemoveToxic(toxic)).await?;
    } else {
        return Err(not_found("toxic"));
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Re-enable every proxy and remove every toxic.
async fn reset(State(store): State<Store>) -> ApiResult {
    let mut store = store.lock().await;
    for entry in store.values_mut() {
        entry.front_toxics.send_replace(Vec::new());
        // One by one: noxious's RemoveAllToxics clears only the upstream list.
        let names: Vec<String> = entry.info.state.lock().toxics.clone().into_vec().into_iter().map(|t| t.name).collect();
        for name in names {
            entry.event(ToxicEventKind::RemoveToxic(name)).await?;
        }
        entry.enable().await?;
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

fn parse_args() -> Result<(String, u16), String> {
    let (mut host, mut port) = ("127.0.0.1".to_owned(), 8474u16);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.trim_start_matches('-') {
            "host" => host = value,
            "port" => port = value.parse().map_err(|_| format!("bad port {value:?}"))?,
            _ => return Err(format!("unknown flag {flag}; usage: toxiproxy-server [-host H] [-port P]")),
        }
    }
    Ok((host, port))
}

#[tokio::main]
async fn main() {
    let (host, port) = parse_args().unwrap_or_else(|e| {
        eprintln!("toxiproxy-server: {e}");
        std::process::exit(2);
    });
    let store: Store = Arc::new(Mutex::new(BTreeMap::new()));
    let app = Router::new()
        .route("/version", get(|| async { VERSION }))
        .route("/reset", post(reset))
        .route("/proxies", get(list_proxies).post(create_proxy))
        .route("/proxies/{name}", get(get_proxy).post(update_proxy).delete(delete_proxy))
        .route("/proxies/{name}/toxics", get(list_toxics).post(create_toxic))
        .route("/proxies/{name}/toxics/{toxic}", get(get_toxic).post(update_toxic).delete(delete_toxic))
        .with_state(store);
    let listener = TcpListener::bind((host.as_str(), port)).await.unwrap_or_else(|e| {
        eprintln!("toxiproxy-server: cannot listen on {host}:{port}: {e}");
        std::process::exit(1);
    });
    let addr = listener.local_addr().expect("bound listener has an address");
    println!("listening on {addr}");
    let _ = std::io::stdout().flush();
    if let Err(e) = axum::serve(listener, app).await {
        eprintln!("toxiproxy-server: {e}");
        std::process::exit(1);
    }
}
