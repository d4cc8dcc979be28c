"""The Spark schemas of the frames the nightly job works on: what extract reads and what the tests build.

Every JDBC read is conformed to one of these (whatever types the dialect chose), so the transforms and checks see
the same types in a run as in the tests.
"""

from pyspark.sql.types import DateType, LongType, StringType, StructField, StructType, TimestampType

ORDERS_SCHEMA = StructType(
    [
        StructField("id", LongType()),
        StructField("user_id", LongType()),
        StructField("total", LongType()),
        StructField("created_at", TimestampType()),
    ]
)
LOGS_SCHEMA = StructType(
    [
        StructField("id", StringType()),
        StructField("order_id", LongType()),
        StructField("status", StringType()),
        StructField("attempts", LongType()),
        StructField("created_at", TimestampType()),
    ]
)
CREDITS_SCHEMA = StructType(
    [
        StructField("id", LongType()),
        StructField("user_id", LongType()),
        StructField("order_id", LongType()),
        StructField("total", LongType()),
        StructField("created_at", TimestampType()),
        # When the order was placed, as its message said (version 2 on); NULL for a credit from a version-1 message.
        StructField("ordered_at", TimestampType()),
    ]
)
DEAD_LETTERS_SCHEMA = StructType(
    [
        StructField("id", LongType()),
        StructField("order_id", LongType()),
        StructField("status", StringType()),
        StructField("created_at", TimestampType()),
    ]
)
FIRST_ORDERS_SCHEMA = StructType([StructField("user_id", LongType()), StructField("first_order_id", LongType())])
DAILY_HISTORY_SCHEMA = StructType(
    [
        StructField("date", DateType()),
        StructField("orders", LongType()),
        StructField("order_units", LongType()),
        StructField("users", LongType()),
        StructField("new_users", LongType()),
        StructField("credited_users", LongType()),
        StructField("credits_awarded", LongType()),
        StructField("credits_total", LongType()),
    ]
)
