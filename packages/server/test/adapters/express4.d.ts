// Express 4, installed under the alias `express4` so the adapter's tests run under Express 4 and 5 side by side. It
// is typed as Express 5: the test apps use only the API the two share (app.use, app.post, req.get, res.status,
// res.set, res.json, app.listen).
declare module 'express4' {
  import express from 'express'
  export default express
}
