export type {
  WebhookDelivery,
  WebhookReceiver,
  WebhookReceiverOptions,
  WebhookResult,
} from './receiver.js'
export { createWebhookReceiver, webhookStatus } from './receiver.js'
export type { VerifyOptions } from './signature.js'
export { SIGNATURE_HEADER, signPayload, verifySignature } from './signature.js'
