//! `magnetar perf produce|consume|e2e`: turns the command line into the benchmark's options.

use std::time::Duration;

use magnetar_perf::pulsar::{
    self, BatchingOptions, ConsumeOptions, ProduceOptions, RunOptions, Target,
};

use crate::cli::{
    PerfConsumeArgs, PerfConsumerArgs, PerfE2eArgs, PerfProduceArgs, PerfProducerArgs,
    PerfTargetArgs,
};

pub fn produce(args: PerfProduceArgs) -> anyhow::Result<()> {
    let (target, run) = target_and_run(&args.target)?;
    pulsar::produce(&target, &run, &produce_options(&args.producer))?;
    Ok(())
}

pub fn consume(args: PerfConsumeArgs) -> anyhow::Result<()> {
    let (target, run) = target_and_run(&args.target)?;
    let subscription = args.consumer.subscription.clone().unwrap_or_else(|| "perf-sub".into());
    pulsar::consume(&target, &run, &consume_options(&args.consumer, subscription, false))?;
    Ok(())
}

pub fn e2e(args: PerfE2eArgs) -> anyhow::Result<()> {
    let (target, run) = target_and_run(&args.target)?;
    let produce = produce_options(&args.producer);
    // e2e measures only what this run sends: a subscription of its own at Latest, dropped at the
    // end, unless the user names one.
    let consume = match args.consumer.subscription.clone() {
        Some(name) => consume_options(&args.consumer, name, false),
        None => consume_options(&args.consumer, format!("perf-e2e-{}", std::process::id()), true),
    };
    pulsar::e2e(&target, &run, &produce, &consume)?;
    Ok(())
}

fn target_and_run(args: &PerfTargetArgs) -> anyhow::Result<(Target, RunOptions)> {
    let target = Target {
        // The file is read by the client, afresh at each connection and challenge.
        auth_token: args.auth_token.as_ref().map(|token| token.trim().to_string()),
        auth_token_file: args.auth_token_file.clone(),
        service_url: args.service_url.clone(),
        admin_url: args.admin_url.clone(),
        topic: args.topic.clone(),
        num_topics: args.num_topics,
        partitions: args.partitions,
        tls_trust_certs_file: args.tls_trust_certs_file.clone(),
    };
    let run = RunOptions {
        duration: (args.time > 0.0).then(|| Duration::from_secs_f64(args.time)),
        messages: (args.num_messages > 0).then_some(args.num_messages),
        warmup: Duration::from_secs_f64(args.warmup_time),
        report_interval: Duration::from_secs_f64(args.report_interval),
        json: args.json,
        threads: args.threads,
    };
    Ok((target, run))
}

fn produce_options(args: &PerfProducerArgs) -> ProduceOptions {
    ProduceOptions {
        rate: args.rate,
        size: args.size,
        producers: args.producers,
        batching: (!args.disable_batching && !args.sync).then(|| BatchingOptions {
            max_messages: args.batch_max_messages,
            max_bytes: args.batch_max_bytes,
            max_delay: Duration::from_secs_f64(args.batch_time_window_ms / 1000.0),
        }),
        max_pending: args.max_pending,
        compression: args.compression,
        sync: args.sync,
    }
}

fn consume_options(
    args: &PerfConsumerArgs,
    subscription: String,
    unsubscribe_at_end: bool,
) -> ConsumeOptions {
    ConsumeOptions {
        consumers: args.consumers,
        subscription,
        unsubscribe_at_end,
        sub_type: args.sub_type,
        receiver_queue: args.receiver_queue,
        initial_position: args.position,
        idle_timeout: (args.idle_timeout > 0.0).then(|| Duration::from_secs_f64(args.idle_timeout)),
    }
}
