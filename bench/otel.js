// Configuration (c): the official OpenTelemetry JS SDK in-process, preloaded
// with `node -r ./otel.js app.js`: sdk-node with the http, fs and dns
// instrumentations and the OTLP/gRPC trace exporter (batch span processor,
// SDK defaults), sending to OTEL_EXPORTER_OTLP_ENDPOINT (the bench sink).
'use strict';
const { NodeSDK } = require('@opentelemetry/sdk-node');
const { OTLPTraceExporter } = require('@opentelemetry/exporter-trace-otlp-grpc');
const { HttpInstrumentation } = require('@opentelemetry/instrumentation-http');
const { FsInstrumentation } = require('@opentelemetry/instrumentation-fs');
const { DnsInstrumentation } = require('@opentelemetry/instrumentation-dns');

const sdk = new NodeSDK({
  serviceName: process.env.OTEL_SERVICE_NAME || 'bench-app',
  traceExporter: new OTLPTraceExporter({ url: process.env.OTEL_EXPORTER_OTLP_ENDPOINT }),
  instrumentations: [new HttpInstrumentation(), new FsInstrumentation(), new DnsInstrumentation()],
});
sdk.start();
process.on('SIGTERM', () => sdk.shutdown().finally(() => process.exit(0)));
