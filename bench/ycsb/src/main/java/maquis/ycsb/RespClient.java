package maquis.ycsb;

import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.Vector;

import redis.clients.jedis.Jedis;
import site.ycsb.ByteIterator;
import site.ycsb.DB;
import site.ycsb.DBException;
import site.ycsb.Status;
import site.ycsb.StringByteIterator;

/**
 * A YCSB client over the Redis protocol: a record is a hash (HSET / HGETALL / HMGET / DEL).
 * Properties: {@code resp.hosts} (host:port,host:port,...: each client thread takes one, round
 * robin) and {@code resp.timeout.ms}. Scans are not supported (the stores have no ordered
 * keys): a scan answers NOT_IMPLEMENTED.
 */
public class RespClient extends DB {
  private static final java.util.concurrent.atomic.AtomicInteger NEXT =
      new java.util.concurrent.atomic.AtomicInteger();

  private Jedis jedis;

  @Override
  public void init() throws DBException {
    Properties p = getProperties();
    String[] hosts = p.getProperty("resp.hosts", "127.0.0.1:6379").split(",");
    String host = hosts[Math.floorMod(NEXT.getAndIncrement(), hosts.length)].trim();
    int colon = host.lastIndexOf(':');
    int timeout = Integer.parseInt(p.getProperty("resp.timeout.ms", "10000"));
    try {
      jedis = new Jedis(host.substring(0, colon), Integer.parseInt(host.substring(colon + 1)), timeout);
      jedis.ping();
    } catch (RuntimeException e) {
      throw new DBException("cannot reach " + host + ": " + e.getMessage(), e);
    }
  }

  @Override
  public void cleanup() {
    if (jedis != null) {
      jedis.close();
    }
  }

  @Override
  public Status read(String table, String key, Set<String> fields, Map<String, ByteIterator> result) {
    try {
      if (fields == null) {
        StringByteIterator.putAllAsByteIterators(result, jedis.hgetAll(key));
      } else {
        String[] names = fields.toArray(new String[0]);
        List<String> values = jedis.hmget(key, names);
        for (int i = 0; i < names.length; i++) {
          if (values.get(i) != null) {
            result.put(names[i], new StringByteIterator(values.get(i)));
          }
        }
      }
      return result.isEmpty() ? Status.NOT_FOUND : Status.OK;
    } catch (RuntimeException e) {
      return Status.ERROR;
    }
  }

  @Override
  public Status scan(String table, String startkey, int recordcount, Set<String> fields,
      Vector<HashMap<String, ByteIterator>> result) {
    return Status.NOT_IMPLEMENTED;
  }

  @Override
  public Status update(String table, String key, Map<String, ByteIterator> values) {
    return write(key, values);
  }

  @Override
  public Status insert(String table, String key, Map<String, ByteIterator> values) {
    return write(key, values);
  }

  private Status write(String key, Map<String, ByteIterator> values) {
    try {
      jedis.hset(key, StringByteIterator.getStringMap(values));
      return Status.OK;
    } catch (RuntimeException e) {
      return Status.ERROR;
    }
  }

  @Override
  public Status delete(String table, String key) {
    try {
      return jedis.del(key) > 0 ? Status.OK : Status.NOT_FOUND;
    } catch (RuntimeException e) {
      return Status.ERROR;
    }
  }

}
