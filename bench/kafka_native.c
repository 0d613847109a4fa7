/* A native librdkafka client for the bench's Kafka rows (bench._kafka_native builds and drives it).
 *
 * confluent-kafka's Python consumer makes one Message object per record (~1.7 µs of client CPU each on
 * the bench machine), so a Python consume row measures the client. This program counts records and
 * value bytes in C, with no output per record, so a row measures the broker.
 *
 *   kafka_native consume BOOTSTRAP TOPIC N [key=value ...]
 *   kafka_native produce BOOTSTRAP TOPIC N SIZE [key=value ...]
 *
 * key=value pairs are librdkafka configuration properties, set after the program's own defaults.
 * Protocol with the parent, one line each on stdout / stdin:
 *   1. setup, untimed (consume: connect and fetch the topic's metadata; produce: one record sent and
 *      acknowledged, so metadata, the connection and InitProducerId are behind us), then "READY";
 *   2. the parent writes "GO";
 *   3. the timed part (consume: assign partition 0 from offset 0 and read until N records arrived;
 *      produce: N records of SIZE bytes, acks=all, idempotent, until all are acknowledged), then one line
 *      "DONE {json}" with the records and bytes, this process's CPU seconds over the timed part
 *      (getrusage: every thread, librdkafka's included), its wall seconds and librdkafka's version.
 * Errors: a message on stderr and exit status 2.
 */
#include <librdkafka/rdkafka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>
#include <time.h>

#define BATCH 10000             /* records per consume_batch_queue / produce_batch call */
#define POLL_MS 1000            /* consume: wait at most this long for each batch */
#define FLUSH_MS 600000         /* produce: every record acknowledged within this */
#define DEADLINE_S 600.0        /* consume: give up after this long */
#define SETUP_MS 30000          /* metadata and the first record: within this */
#define MAX_REPORTED_ERRORS 5   /* errors written to stderr, at most */

static long long delivered, failed;

static void die(const char *what, const char *why) {
    fprintf(stderr, "kafka_native: %s: %s\n", what, why);
    exit(2);
}

static double seconds(struct timeval tv) { return tv.tv_sec + tv.tv_usec / 1e6; }

static double cpu_now(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return seconds(ru.ru_utime) + seconds(ru.ru_stime);
}

static double wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void set(rd_kafka_conf_t *conf, const char *key, const char *value) {
    char err[512];
    if (rd_kafka_conf_set(conf, key, value, err, sizeof err) != RD_KAFKA_CONF_OK)
        die(key, err);
}

/* the caller's key=value properties, after the defaults; one this librdkafka does not know (an older
 * system library) is left at its default, with a warning */
static void set_extra(rd_kafka_conf_t *conf, int argc, char **argv) {
    char err[512];
    for (int i = 0; i < argc; i++) {
        char *eq = strchr(argv[i], '=');
        if (eq == NULL)
            die(argv[i], "not key=value");
        *eq = '\0';
        rd_kafka_conf_res_t res = rd_kafka_conf_set(conf, argv[i], eq + 1, err, sizeof err);
        if (res == RD_KAFKA_CONF_UNKNOWN)
            fprintf(stderr, "kafka_native: librdkafka %s: %s (left at its default)\n", rd_kafka_version_str(), err);
        else if (res != RD_KAFKA_CONF_OK)
            die(argv[i], err);
        *eq = '=';
    }
}

static void ready_then_go(void) {
    char line[64];
    printf("READY\n");
    fflush(stdout);
    if (fgets(line, sizeof line, stdin) == NULL || strncmp(line, "GO", 2) != 0)
        die("stdin", "the parent went away before GO");
}

static void done(long long records, long long bytes, long long errors, double cpu0, double t0) {
    double cpu = cpu_now() - cpu0, wall = wall_now() - t0;
    printf("DONE {\"records\": %lld, \"bytes\": %lld, \"errors\": %lld, \"cpu_s\": %.6f, \"wall_s\": %.6f, "
           "\"librdkafka\": \"%s\"}\n", records, bytes, errors, cpu, wall, rd_kafka_version_str());
    fflush(stdout);
}

static int consume(const char *bootstrap, const char *topic, long long n, int argc, char **argv) {
    char err[512], group[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    snprintf(group, sizeof group, "bench-native-%s", topic);
    set(conf, "bootstrap.servers", bootstrap);
    set(conf, "group.id", group);
    set(conf, "enable.auto.commit", "false");
    set(conf, "enable.auto.offset.store", "false");
    set_extra(conf, argc, argv);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
    if (rk == NULL)
        die("rd_kafka_new", err);
    /* the connection and the topic's metadata before GO */
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
    const struct rd_kafka_metadata *md;
    rd_kafka_resp_err_t e = rd_kafka_metadata(rk, 0, rkt, &md, SETUP_MS);
    if (e)
        die("metadata", rd_kafka_err2str(e));
    if (md->topic_cnt != 1 || md->topics[0].err || md->topics[0].partition_cnt < 1)
        die("metadata", "the topic has no partition 0");
    rd_kafka_metadata_destroy(md);
    rd_kafka_topic_destroy(rkt);
    rd_kafka_queue_t *queue = rd_kafka_queue_get_consumer(rk);
    rd_kafka_message_t **batch = malloc(BATCH * sizeof *batch);
    if (queue == NULL || batch == NULL)
        die("setup", "no consumer queue or memory");

    ready_then_go();
    double cpu0 = cpu_now(), t0 = wall_now();
    rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(parts, topic, 0)->offset = 0;
    e = rd_kafka_assign(rk, parts);
    if (e)
        die("assign", rd_kafka_err2str(e));
    rd_kafka_topic_partition_list_destroy(parts);
    long long got = 0, bytes = 0, errors = 0;
    while (got < n) {
        if (wall_now() - t0 > DEADLINE_S)
            die("consume", "not every record arrived in time");
        /* no more than are left: the call waits for as many as it is asked (or POLL_MS) */
        ssize_t k = rd_kafka_consume_batch_queue(queue, POLL_MS, batch, n - got < BATCH ? (size_t)(n - got) : BATCH);
        if (k < 0)
            die("consume_batch_queue", rd_kafka_err2str(rd_kafka_last_error()));
        for (ssize_t i = 0; i < k; i++) {
            rd_kafka_message_t *m = batch[i];
            if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
                got++;
                bytes += m->len;
            } else if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF && errors++ < MAX_REPORTED_ERRORS) {
                fprintf(stderr, "kafka_native: consumer error: %s\n", rd_kafka_message_errstr(m));
            }
            rd_kafka_message_destroy(m);
        }
    }
    done(got, bytes, errors, cpu0, t0);
    free(batch);
    rd_kafka_queue_destroy(queue);
    /* nothing to commit: leave without the group's close handshake */
    rd_kafka_destroy_flags(rk, RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE);
    return 0;
}

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque) {
    (void)rk;
    (void)opaque;
    if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        delivered++;
    } else if (failed++ < MAX_REPORTED_ERRORS) {
        fprintf(stderr, "kafka_native: delivery failed: %s\n", rd_kafka_err2str(m->err));
    }
}

/* n records of the one payload (never copied: librdkafka points at it until each is acknowledged) */
static void produce_n(rd_kafka_t *rk, rd_kafka_topic_t *rkt, rd_kafka_message_t *msgs, char *payload,
                      size_t size, long long n) {
    long long sent = 0;
    while (sent < n) {
        int k = n - sent < BATCH ? (int)(n - sent) : BATCH;
        memset(msgs, 0, k * sizeof *msgs);
        for (int i = 0; i < k; i++) {
            msgs[i].payload = payload;
            msgs[i].len = size;
        }
        int queued = rd_kafka_produce_batch(rkt, 0, 0, msgs, k);
        for (int i = 0; queued < k && i < k; i++) {
            if (msgs[i].err == RD_KAFKA_RESP_ERR_NO_ERROR)
                continue;
            if (msgs[i].err != RD_KAFKA_RESP_ERR__QUEUE_FULL)
                die("produce_batch", rd_kafka_err2str(msgs[i].err));
            /* the client's queue is full: let it send, then this one record again */
            while (rd_kafka_produce(rkt, 0, 0, payload, size, NULL, 0, NULL) == -1) {
                if (rd_kafka_last_error() != RD_KAFKA_RESP_ERR__QUEUE_FULL)
                    die("produce", rd_kafka_err2str(rd_kafka_last_error()));
                rd_kafka_poll(rk, 5);
            }
        }
        sent += k;
        rd_kafka_poll(rk, 0);
    }
}

static int produce(const char *bootstrap, const char *topic, long long n, size_t size, int argc, char **argv) {
    char err[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    set(conf, "bootstrap.servers", bootstrap);
    set(conf, "acks", "all");
    set(conf, "enable.idempotence", "true");
    set_extra(conf, argc, argv);
    rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
    if (rk == NULL)
        die("rd_kafka_new", err);
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
    char *payload = malloc(size ? size : 1);
    rd_kafka_message_t *msgs = malloc(BATCH * sizeof *msgs);
    if (rkt == NULL || payload == NULL || msgs == NULL)
        die("setup", "no topic handle or memory");
    memset(payload, 'x', size);
    /* one untimed record: metadata, the connection and InitProducerId before GO */
    produce_n(rk, rkt, msgs, payload, size, 1);
    if (rd_kafka_flush(rk, SETUP_MS) != RD_KAFKA_RESP_ERR_NO_ERROR || delivered != 1)
        die("produce", "the first record was not acknowledged");

    ready_then_go();
    double cpu0 = cpu_now(), t0 = wall_now();
    produce_n(rk, rkt, msgs, payload, size, n);
    if (rd_kafka_flush(rk, FLUSH_MS) != RD_KAFKA_RESP_ERR_NO_ERROR)
        die("flush", "records still unacknowledged");
    done(delivered - 1, (delivered - 1) * (long long)size, failed, cpu0, t0);
    rd_kafka_topic_destroy(rkt);
    rd_kafka_destroy(rk);
    free(msgs);
    free(payload);
    return failed ? 2 : 0;
}

int main(int argc, char **argv) {
    /* never outlive the bench client that started us (the harness kills it when a run times out) */
    pid_t parent = getppid();
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
        return 2;
    if (argc >= 5 && strcmp(argv[1], "consume") == 0)
        return consume(argv[2], argv[3], atoll(argv[4]), argc - 5, argv + 5);
    if (argc >= 6 && strcmp(argv[1], "produce") == 0)
        return produce(argv[2], argv[3], atoll(argv[4]), (size_t)atoll(argv[5]), argc - 6, argv + 6);
    fprintf(stderr, "usage: kafka_native consume BOOTSTRAP TOPIC N [key=value ...]\n"
                    "       kafka_native produce BOOTSTRAP TOPIC N SIZE [key=value ...]\n");
    return 2;
}
