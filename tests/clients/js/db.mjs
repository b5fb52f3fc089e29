// What the client scripts share: running work on a connection made from an IntegreSQL
// database config (a TemplateDatabase's or a TestDatabase's `config`).
import pg from 'pg'

export async function withDb(config, work) {
  const db = new pg.Client({
    host: config.host,
    port: config.port,
    user: config.username,
    password: config.password,
    database: config.database,
  })
  await db.connect()
  try {
    return await work(db)
  } finally {
    await db.end()
  }
}
