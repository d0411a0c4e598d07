# One PostgreSQL server; the `prefect` and `mlflow` databases (and roles) are
# created on it by infra/k8s/db-init-job.yaml, so the two Alembic histories
# never share a database. The master password lives in Secrets Manager (RDS-managed).
resource "aws_security_group" "db" {
  name        = "${var.cluster_name}-postgres"
  description = "PostgreSQL reachable from the EKS nodes only"
  vpc_id      = module.vpc.vpc_id
}

resource "aws_vpc_security_group_ingress_rule" "db_from_nodes" {
  security_group_id            = aws_security_group.db.id
  description                  = "PostgreSQL from EKS nodes"
  referenced_security_group_id = module.eks.node_security_group_id
  from_port                    = 5432
  to_port                      = 5432
  ip_protocol                  = "tcp"
}

resource "aws_db_parameter_group" "postgres" {
  name   = "${var.cluster_name}-postgres${var.db_engine_version}"
  family = "postgres${var.db_engine_version}"

  parameter {
    name  = "rds.force_ssl"
    value = "1"
  }
  parameter {
    name  = "log_min_duration_statement"
    value = "1000"
  }
}

resource "aws_db_instance" "postgres" {
  # checkov:skip=CKV_AWS_157:Multi-AZ is a variable (db_multi_az, default false) because it doubles the database cost; turn it on for production.
  # checkov:skip=CKV_AWS_118:Enhanced monitoring needs an extra IAM role and costs per instance; Performance Insights is on.
  # checkov:skip=CKV2_AWS_30:Query logging is configured through the parameter group (log_min_duration_statement).
  identifier     = "${var.cluster_name}-postgres"
  engine         = "postgres"
  engine_version = var.db_engine_version
  instance_class = var.db_instance_class

  allocated_storage     = var.db_allocated_storage
  max_allocated_storage = var.db_allocated_storage * 4
  storage_type          = "gp3"
  storage_encrypted     = true
  kms_key_id            = aws_kms_key.data.arn

  db_name                             = "postgres"
  username                            = "arl_admin"
  manage_master_user_password         = true
  iam_database_authentication_enabled = true

  db_subnet_group_name   = module.vpc.database_subnet_group_name
  vpc_security_group_ids = [aws_security_group.db.id]
  publicly_accessible    = false
  multi_az               = var.db_multi_az
  parameter_group_name   = aws_db_parameter_group.postgres.name

  backup_retention_period               = 7
  copy_tags_to_snapshot                 = true
  deletion_protection                   = var.db_deletion_protection
  skip_final_snapshot                   = false
  final_snapshot_identifier             = "${var.cluster_name}-postgres-final"
  auto_minor_version_upgrade            = true
  enabled_cloudwatch_logs_exports       = ["postgresql", "upgrade"]
  performance_insights_enabled          = true
  performance_insights_kms_key_id       = aws_kms_key.data.arn
  performance_insights_retention_period = 7
}
