// Drives the real npm rabbitmq-stream-js-client@0.6.2 against `riverbed serve` (RabbitMQ Stream listener and
// the HTTP listener with RabbitMQ's management API), nothing in between.
//
//   node rmq_js_scenarios.js '<json config>'
//
// Config: {scenario, port (RabbitMQ Stream), httpPort, stream, n?, timeoutMs?}. Prints one JSON line with the
// results on stdout and exits 0; a failed step is reported as {error: "..."} (with what was seen so far).
// NODE_PATH must hold the node_modules installed by ci/npm-rmq-js-deps.sh.
//
// The management calls are made the way the client's own test suite makes them (its test/support/rabbit.ts):
// PUT /api/queues/%2F/<name> with {"x-queue-type": "stream"}, a super stream as PUT /api/exchanges/%2F/<name>
// then the partition queues then POST /api/bindings/%2F/e/<exchange>/q/<partition> (all concurrently, as it
// does), GET /api/queues/%2F/<name> for `messages`, DELETE of each.
'use strict'

const rmq = require('rabbitmq-stream-js-client')

const cfg = JSON.parse(process.argv[2])
const timeoutMs = cfg.timeoutMs || 20000
const AUTH = 'Basic ' + Buffer.from('guest:guest').toString('base64')
const uncaught = []
let current = {}            // the running scenario's results so far (reported on a timeout)
process.on('uncaughtException', (e) => uncaught.push(String(e && e.stack ? e.stack : e)))
process.on('unhandledRejection', (e) => uncaught.push(String(e && e.stack ? e.stack : e)))

const logger = {
    debug: () => {}, info: () => {}, warn: () => {},
    error: (m) => { if (cfg.verbose) process.stderr.write(`js-client error: ${m}\n`) },
}

function done(result) {
    result.uncaught = uncaught
    process.stdout.write(JSON.stringify(result, (k, v) => typeof v === 'bigint' ? Number(v) : v) + '\n')
    process.exit(0)
}

function until(pred, ms) {
    return new Promise((resolve) => {
        const t0 = Date.now()
        const tick = async () => {
            let ok = false
            try { ok = await pred() } catch (e) { ok = false }
            if (ok) resolve(true)
            else if (Date.now() - t0 > ms) resolve(false)
            else setTimeout(tick, 20)
        }
        tick()
    })
}

async function api(method, path, body) {
    const res = await fetch(`http://127.0.0.1:${cfg.httpPort}${path}`, {
        method, headers: {authorization: AUTH, 'content-type': 'application/json'},
        body: body === undefined ? undefined : JSON.stringify(body),
    })
    const text = await res.text()
    let json = null
    try { json = text ? JSON.parse(text) : null } catch (e) { json = text }
    return {status: res.status, body: json}
}

// --- the client suite's fixtures (test/support/rabbit.ts), as HTTP calls
const rabbit = {
    createStream: (name) => api('PUT', `/api/queues/%2F/${name}`,
        {auto_delete: false, durable: true, arguments: {'x-queue-type': 'stream'}}),
    deleteStream: (name) => api('DELETE', `/api/queues/%2F/${name}`),
    createExchange: (name) => api('PUT', `/api/exchanges/%2F/${name}`,
        {type: 'direct', auto_delete: false, durable: true, arguments: {'x-super-stream-enabled': 'true'}}),
    deleteExchange: (name) => api('DELETE', `/api/exchanges/%2F/${name}`),
    createBinding: (exchange, stream, key) => api('POST', `/api/bindings/%2F/e/${exchange}/q/${stream}`,
        {routing_key: key, arguments: {'x-stream-partition-order': key}}),
    getQueueInfo: (name) => api('GET', `/api/queues/%2F/${name}`),
    async createSuperStream(name, n = 3) {
        const statuses = {}
        statuses.exchange = (await this.createExchange(name)).status
        const parts = [...Array(n).keys()].map((i) => `${name}-${i}`)
        statuses.queues = (await Promise.all(parts.map((p) => this.createStream(p)))).map((r) => r.status)
        statuses.bindings = (await Promise.all(parts.map((p, i) => this.createBinding(name, p, `${i}`))))
            .map((r) => r.status)
        return statuses
    },
    async deleteSuperStream(name, n = 3) {
        const statuses = {exchange: (await this.deleteExchange(name)).status}
        const parts = [...Array(n).keys()].map((i) => `${name}-${i}`)
        statuses.queues = (await Promise.all(parts.map((p) => this.deleteStream(p)))).map((r) => r.status)
        return statuses
    },
}

function connect(extra) {
    return rmq.connect(Object.assign({
        hostname: '127.0.0.1', port: cfg.port, username: 'guest', password: 'guest', vhost: '/', heartbeat: 0,
    }, extra || {}), logger)
}

async function publishConfirmed(publisher, messages) {
    const confirmed = new Set()
    publisher.on('publish_confirm', (err, ids) => { if (!err) ids.forEach((i) => confirmed.add(Number(i))) })
    const sent = []
    for (const [body, opts] of messages) sent.push(Number((await publisher.send(Buffer.from(body), opts || {})).publishingId))
    await publisher.flush()
    const ok = await until(() => sent.every((i) => confirmed.has(i)), timeoutMs)
    return {sent: sent.length, confirmed: ok}
}

// The management-API fixtures, then the client on what they made.
async function mgmtFixtures() {
    const out = current = {steps: {}}
    const n = cfg.n || 50
    const stream = cfg.stream
    const superStream = `${cfg.stream}-super`
    out.steps.createStream = (await rabbit.createStream(stream)).status
    out.steps.createStreamAgain = (await rabbit.createStream(stream)).status
    out.steps.superStream = await rabbit.createSuperStream(superStream)
    const client = await connect()
    out.serverVersion = client.rabbitManagementVersion
    const publisher = await client.declarePublisher({stream})
    out.publish = await publishConfirmed(publisher, [...Array(n).keys()].map((i) => [`m-${i}`]))
    await until(async () => ((await rabbit.getQueueInfo(stream)).body || {}).messages === n, timeoutMs)
    out.queueInfo = (await rabbit.getQueueInfo(stream)).body
    out.partitions = await client.queryPartitions({superStream})
    out.routes = {}
    for (const key of ['0', '1', '2', 'nope']) out.routes[key] = await client.routeQuery({routingKey: key, superStream})
    const ssp = await client.declareSuperStreamPublisher({superStream, routingStrategy: 'key'}, (content, opts) => opts.messageProperties.messageId)
    for (let i = 0; i < 30; i++) await ssp.send(Buffer.from(`s-${i}`), {messageProperties: {messageId: `${i % 3}`}})
    const got = []
    await client.declareSuperStreamConsumer({superStream, offset: rmq.Offset.first()}, (msg) => got.push(msg.content.toString()))
    await until(() => got.length >= 30, timeoutMs)
    out.superConsumed = got.length
    out.partitionMessages = []
    for (const p of out.partitions) out.partitionMessages.push(((await rabbit.getQueueInfo(p)).body || {}).messages)
    await client.close()
    out.steps.deleteSuperStream = await rabbit.deleteSuperStream(superStream)
    out.steps.deleteStream = (await rabbit.deleteStream(stream)).status
    out.steps.getDeleted = (await rabbit.getQueueInfo(stream)).status
    out.steps.getDeletedExchange = (await api('GET', `/api/exchanges/%2F/${superStream}`)).status
    done(out)
}

// Item 2: the server's version lets the client create and delete super streams and filter.
async function superStreamsAndFiltering() {
    const out = current = {}
    const client = await connect()
    out.serverVersion = client.rabbitManagementVersion
    const superStream = `${cfg.stream}-ss`
    out.created = await client.createSuperStream({streamName: superStream}, undefined, 3)
    out.partitions = await client.queryPartitions({superStream})
    out.exchange = (await api('GET', `/api/exchanges/%2F/${superStream}`)).status
    out.bindings = ((await api('GET', `/api/exchanges/%2F/${superStream}/bindings/source`)).body || [])
        .map((b) => [b.destination, b.routing_key])
    out.deleted = await client.deleteSuperStream({streamName: superStream})
    out.partitionsAfterDelete = (await rabbit.getQueueInfo(`${superStream}-0`)).status

    const stream = `${cfg.stream}-filtered`
    await client.createStream({stream})
    const publisher = await client.declarePublisher({stream}, (msg) => msg.applicationProperties && msg.applicationProperties.region)
    // one batch per region: the chunks' bloom filters then tell the regions apart
    for (const region of ['A', 'B', 'A', 'B']) {
        const r = await publishConfirmed(publisher, [...Array(20).keys()].map((i) => [`${region}-${i}`, {applicationProperties: {region}}]))
        if (!r.confirmed) return done(Object.assign(out, {error: 'filtered publish not confirmed'}))
    }
    const got = []
    await client.declareConsumer({
        stream, offset: rmq.Offset.first(),
        filter: {values: ['A'], matchUnfiltered: false,
                 postFilterFunc: (msg) => msg.applicationProperties && msg.applicationProperties.region === 'A'},
    }, (msg) => got.push(msg.content.toString()))
    await until(() => got.length >= 40, timeoutMs)
    await new Promise((r) => setTimeout(r, 300))
    out.filtered = got
    await client.close()
    await rabbit.deleteStream(stream)
    done(out)
}

// Item 3: the client's connections are closed through the management API while it consumes and publishes;
// it notices (connection_closed), restarts as an application does against RabbitMQ, and carries on.
async function closedByApi() {
    const out = current = {closed: [], deleteStatus: null}
    const name = `${cfg.stream}-conn`
    const stream = cfg.stream
    await rabbit.createStream(stream)
    const onClosed = (hadError) => out.closed.push(hadError)
    const client = await connect({connectionName: name, listeners: {connection_closed: onClosed}})
    const got = []
    await client.declareConsumer({stream, offset: rmq.Offset.first(), connectionClosedListener: onClosed},
        (msg) => got.push(msg.content.toString()))
    const publisher = await client.declarePublisher({stream, connectionClosedListener: onClosed})
    out.before = await publishConfirmed(publisher, [...Array(10).keys()].map((i) => [`before-${i}`]))
    await until(() => got.length >= 10, timeoutMs)
    out.listed = ((await api('GET', '/api/connections')).body || []).filter((c) => c.name === name).length
    out.deleteStatus = (await api('DELETE', `/api/connections/${encodeURIComponent(name)}`)).status
    out.noticed = await until(() => out.closed.length >= out.listed, timeoutMs)
    out.closedAfterDelete = out.closed.slice()
    await client.restart()          // what an application does on connection_closed (waits 5 s first)
    out.relisted = ((await api('GET', '/api/connections')).body || []).filter((c) => c.name === name).length
    out.after = await publishConfirmed(publisher, [...Array(10).keys()].map((i) => [`after-${i}`]))
    await until(() => got.includes('after-9'), timeoutMs)
    out.got = got
    await client.close()
    await rabbit.deleteStream(stream)
    done(out)
}

const scenarios = {mgmt_fixtures: mgmtFixtures, super_streams_and_filtering: superStreamsAndFiltering,
                   closed_by_api: closedByApi}
const run = scenarios[cfg.scenario]
if (!run) done({error: `unknown scenario ${cfg.scenario}`})
setTimeout(() => done(Object.assign(current, {error: 'timeout', timeout: true})), (cfg.totalTimeoutMs || 60000)).unref()
run().catch((e) => done({error: String(e && e.stack ? e.stack : e)}))
