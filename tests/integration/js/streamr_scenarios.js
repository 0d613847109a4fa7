// Drives the real npm streamr-client@0.12.2 against a Riverbed WebSocket JSON listener.
//
//   node streamr_scenarios.js '<json config>'
//
// Config: {scenario, url, restUrl, apiKey?, stream, n?, m?, partition?, resend?, timeoutMs?}. Prints one JSON
// line with the results on stdout and exits 0 (a scenario that times out reports {timeout: true, ...}).
// NODE_PATH must hold the node_modules installed by ci/npm-test-deps.sh.
'use strict'

const StreamrClient = require('streamr-client')

const cfg = JSON.parse(process.argv[2])
const timeoutMs = cfg.timeoutMs || 30000

function newClient(extra) {
    const c = new StreamrClient(Object.assign({
        url: cfg.url, restUrl: cfg.restUrl, apiKey: cfg.apiKey || null, autoConnect: true, autoDisconnect: false,
    }, extra || {}))
    c.errors = []
    c.resendRequests = []
    c.on('error', (e) => c.errors.push(String(e && e.message ? e.message : e)))
    c.on('connected', () => {
        // count the resend requests the client makes (gap detection shows up as resend_from/resend_to)
        const conn = c.connection
        if (!conn.__wrapped) {
            const send = conn.send.bind(conn)
            conn.send = (req) => {
                if (req.type === 'resend') c.resendRequests.push(req)
                send(req)
            }
            conn.__wrapped = true
        }
    })
    return c
}

function done(result) {
    process.stdout.write(JSON.stringify(result) + '\n')
    process.exit(0)
}

function until(pred, ms) {
    return new Promise((resolve) => {
        const t0 = Date.now()
        const tick = () => {
            if (pred()) resolve(true)
            else if (Date.now() - t0 > ms) resolve(false)
            else setTimeout(tick, 5)
        }
        tick()
    })
}

function meta(m) {
    return [m.offset, m.previousOffset, m.timestamp, m.streamPartition]
}

function subscribe(client, options, sink) {
    return new Promise((resolve) => {
        const sub = client.subscribe(options, (content, msg) => sink.push({content, meta: meta(msg)}))
        sub.on('subscribed', () => resolve(sub))
    })
}

// A publishes n, A (subscribed) receives them live; then B subscribes with resend_all, gets the n, then
// A publishes m more and B gets them live: B must not stay in "resending", and nobody may see a gap.
async function liveAndResend() {
    const a = newClient()
    const gotA = []
    await subscribe(a, {stream: cfg.stream}, gotA)
    for (let i = 0; i < cfg.n; i++) a.produceToStream(cfg.stream, {i, pad: 'x'.repeat(60)})
    const liveOk = await until(() => gotA.length >= cfg.n, timeoutMs)
    const b = newClient()
    const gotB = []
    const subB = await subscribe(b, {stream: cfg.stream, resend_all: true}, gotB)
    const resendOk = await until(() => gotB.length >= cfg.n && !subB.isResending(), timeoutMs)
    for (let i = cfg.n; i < cfg.n + cfg.m; i++) a.produceToStream(cfg.stream, {i, pad: 'x'.repeat(60)})
    const laterOk = await until(() => gotB.length >= cfg.n + cfg.m && gotA.length >= cfg.n + cfg.m, timeoutMs)
    const order = (got) => got.every((x, k) => x.content.i === k)
    const chain = (got) => got.every((x, k) => k === 0 || x.meta[1] === got[k - 1].meta[0])
    done({
        liveOk, resendOk, laterOk, countA: gotA.length, countB: gotB.length, orderA: order(gotA), orderB: order(gotB),
        chainA: chain(gotA), chainB: chain(gotB), resendingB: subB.isResending(),
        gapRequestsA: a.resendRequests.filter((r) => r.resend_to !== undefined).length,
        gapRequestsB: b.resendRequests.filter((r) => r.resend_to !== undefined).length,
        resendRequestsB: b.resendRequests.length, errors: a.errors.concat(b.errors),
        firstB: gotB[0] && gotB[0].meta,
    })
}

// Subscribe (with cfg.resend options, if any) and collect cfg.n messages.
async function collect() {
    const c = newClient()
    const got = []
    const opts = Object.assign({stream: cfg.stream}, cfg.partition ? {partition: cfg.partition} : {}, cfg.resend || {})
    const sub = await Promise.race([subscribe(c, opts, got), until(() => c.errors.length > 0, timeoutMs)])
    if (sub === true || sub === false) {
        await new Promise((r) => setTimeout(r, 100))
        done({subscribed: false, errors: c.errors, got})
    }
    // the resend (if any) is over and, when asked, the own publishes are back
    const ok1 = await until(() => !sub.isResending(), timeoutMs)
    if (cfg.publish) for (const x of cfg.publish) c.produceToStream(cfg.stream, x)
    const ok = ok1 && await until(() => got.length >= cfg.n && !sub.isResending(), timeoutMs)
    await new Promise((r) => setTimeout(r, cfg.settleMs || 200))
    done({subscribed: true, ok, got, errors: c.errors, resendRequests: c.resendRequests.length})
}

// Publish cfg.messages with produceToStream, then wait a little (publish has no acknowledgement).
async function publish() {
    const c = newClient()
    c.connect()
    await until(() => c.isConnected(), timeoutMs)
    for (const x of cfg.messages) c.produceToStream(cfg.stream, x)
    await new Promise((r) => setTimeout(r, cfg.settleMs || 300))
    done({errors: c.errors})
}

const scenarios = {liveAndResend, collect, publish}
setTimeout(() => done({timeout: true}), timeoutMs + 5000)
scenarios[cfg.scenario]().catch((e) => done({exception: String(e && e.stack ? e.stack : e)}))
