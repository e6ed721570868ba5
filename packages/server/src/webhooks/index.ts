export type { VerifyOptions } from './signature.js'
export { SIGNATURE_HEADER, signPayload, verifySignature } from './signature.js'
